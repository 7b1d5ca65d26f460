// MUTWO_DCHECK(condition) << "what was wrong": an invariant checked in
// builds without NDEBUG (Debug and the sanitizer builds), or where
// MUTWO_DCHECK_ALWAYS_ON is defined; a failure prints the file, line,
// condition and message to stderr and aborts. Otherwise (Release,
// RelWithDebInfo) the condition and the message are compiled but never
// evaluated. For what the code guarantees itself (a planner's
// simulated peak is not negative), not for bad input, which gets a Status.
// (Abseil 20220623, Debian bookworm's, has no absl/log and so no
// ABSL_DCHECK; ABSL_ASSERT takes no message.)
#ifndef MUTWO_COMMON_DCHECK_H_
#define MUTWO_COMMON_DCHECK_H_

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace mutwo::internal {

// Collects the message of a failed MUTWO_DCHECK; aborts when destroyed.
class DcheckFailure {
 public:
  DcheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": MUTWO_DCHECK(" << condition
            << ") failed: ";
  }
  DcheckFailure(const DcheckFailure&) = delete;
  DcheckFailure& operator=(const DcheckFailure&) = delete;
  [[noreturn]] ~DcheckFailure() {
    const std::string message = stream_.str();
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    std::abort();
  }
  template <typename T>
  DcheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

}  // namespace mutwo::internal

#if !defined(NDEBUG) || defined(MUTWO_DCHECK_ALWAYS_ON)
#define MUTWO_DCHECK(condition) \
  while (!(condition))          \
  ::mutwo::internal::DcheckFailure(__FILE__, __LINE__, #condition)
#else
#define MUTWO_DCHECK(condition) \
  while (false && (condition))  \
  ::mutwo::internal::DcheckFailure(__FILE__, __LINE__, #condition)
#endif

#endif  // MUTWO_COMMON_DCHECK_H_
