// Numbers as text in flags, run settings and messages: the shortest text that reads back as the
// same double.
#ifndef TAPEGRAD_TRAIN_FORMAT_NUMBER_H_
#define TAPEGRAD_TRAIN_FORMAT_NUMBER_H_

#include <string>

namespace tg::train {

// A number as the shortest text that reads back as the same double ("0.001", "1e+300", "nan"),
// whole numbers below 1e15 as integers ("100000").
std::string FormatNumber(double value);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_FORMAT_NUMBER_H_
