// ThrowsError: runs a callable and checks that it throws tg::Error whose message contains a
// given substring (gmock's HasSubstr without linking gmock).
//
//   EXPECT_TRUE(ThrowsError([&] { x.view({6}); }, "view:"));
#ifndef TAPEGRAD_TESTS_TENSOR_THROWS_H_
#define TAPEGRAD_TESTS_TENSOR_THROWS_H_

#include <exception>
#include <string>

#include "gtest/gtest.h"
#include "tensor/error.h"

namespace tg {
namespace testing {

template <typename Fn>
::testing::AssertionResult ThrowsError(Fn&& fn, const std::string& substring) {
  try {
    fn();
  } catch (const ::tg::Error& e) {
    const std::string message = e.what();
    if (message.find(substring) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "tg::Error message \"" << message << "\" does not contain \"" << substring << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure()
           << "expected tg::Error, got another exception: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "expected tg::Error, got a non-std exception";
  }
  return ::testing::AssertionFailure()
         << "expected tg::Error containing \"" << substring << "\", nothing was thrown";
}

// Exact message match.
template <typename Fn>
::testing::AssertionResult ThrowsErrorExactly(Fn&& fn, const std::string& expected) {
  try {
    fn();
  } catch (const ::tg::Error& e) {
    if (expected == e.what()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "tg::Error message \"" << e.what() << "\" is not \"" << expected << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure()
           << "expected tg::Error, got another exception: " << e.what();
  }
  return ::testing::AssertionFailure()
         << "expected tg::Error \"" << expected << "\", nothing was thrown";
}

}  // namespace testing
}  // namespace tg

#endif  // TAPEGRAD_TESTS_TENSOR_THROWS_H_
