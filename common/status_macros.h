// Status propagation helpers used across mutwo. Inside the project errors are
// absl::Status / absl::StatusOr; they become grpc::Status once, at the RPC
// edge (see grpc_status.h).
#ifndef MUTWO_COMMON_STATUS_MACROS_H_
#define MUTWO_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MUTWO_STATUS_CONCAT_INNER_(a, b) a##b
#define MUTWO_STATUS_CONCAT_(a, b) MUTWO_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define MUTWO_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status mutwo_status_ = (expr);         \
    if (!mutwo_status_.ok()) return mutwo_status_; \
  } while (0)

// `MUTWO_ASSIGN_OR_RETURN(auto x, MakeX());` evaluates an absl::StatusOr,
// returns its status when not OK, and otherwise moves the value into `lhs`.
#define MUTWO_ASSIGN_OR_RETURN(lhs, expr) \
  MUTWO_ASSIGN_OR_RETURN_IMPL_(           \
      MUTWO_STATUS_CONCAT_(mutwo_statusor_, __LINE__), lhs, expr)

// `statusor` is a name the macro declares and `lhs` may be a declaration
// (`auto x`): neither can be put in parentheses.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define MUTWO_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // MUTWO_COMMON_STATUS_MACROS_H_
