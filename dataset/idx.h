// IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or raw: a reader that validates
// every header field against the file's length before it allocates, and a writer for tests and
// conversion tools.
//
//   absl::StatusOr<tg::RawTensor> images = tg::data::ReadIdx("train-images-idx3-ubyte.gz");
//   if (!images.ok()) return images.status();   // e.g. DataLoss "... expected 47040016 bytes ..."
//   // images->dtype() == tg::kU8, images->shape() == [60000, 28, 28]
//
// Format (big-endian): bytes 0 and 1 are 0x00, byte 2 is the element type (only 0x08, unsigned
// byte, is supported), byte 3 the number of dims (1 to 4); then one uint32 size per dim; then
// the elements in row-major order, nothing after them. Files are opened with zlib, which reads
// gzip streams and plain files alike; byte counts in messages are of the decompressed stream. A
// gzip file is one gzip member that ends the file (as every MNIST distribution is): bytes after
// it, which zlib would skip in silence, and concatenated members are DataLoss.
//
// Errors (absl::Status codes):
//   NotFound (and the other errno codes)  the file cannot be opened; the message names the path
//   InvalidArgument  not an IDX file (magic), unsupported element type, 0 or more than 4 dims, a
//                    size of 0, or a payload larger than `max_bytes`
//   DataLoss         truncated header or data, trailing bytes, or a corrupt gzip stream; the
//                    message gives the expected and the found byte counts
// No file can make the reader allocate more than min(file's decompressed length, max_bytes)
// bytes for the data (the buffer grows as bytes arrive).
#ifndef TAPEGRAD_DATASET_IDX_H_
#define TAPEGRAD_DATASET_IDX_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor/tensor.h"

namespace tg::data {

// The default bound on an IDX payload (4 GiB); Fashion-MNIST's largest file holds 47 MB.
inline constexpr int64_t kIdxMaxBytes = int64_t{1} << 32;

// Reads an IDX file of unsigned bytes: a contiguous CPU tensor of dtype u8 whose shape is the
// file's dims (e.g. [N, 28, 28] for images, [N] for labels).
absl::StatusOr<RawTensor> ReadIdx(const std::string& path, int64_t max_bytes = kIdxMaxBytes);

// Writes `data` (u8, 1 to 4 dims, every size in [1, 2^32)) as an IDX file, gzip-compressed when
// `gzip` is true (the reader does not look at the file name). Throws tg::Error on a tensor it
// cannot represent; returns the errno status when the file cannot be written.
absl::Status WriteIdx(const std::string& path, const RawTensor& data, bool gzip);

}  // namespace tg::data

#endif  // TAPEGRAD_DATASET_IDX_H_
