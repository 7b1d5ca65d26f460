// Times as `mutwo jobs` shows them: when a job was submitted as a local
// date and time, how long ago it last changed as an age ("3m ago"), so
// that a list read at a glance answers "which one is mine, is it moving".
#ifndef MUTWO_CLIENT_TIME_TEXT_H_
#define MUTWO_CLIENT_TIME_TEXT_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace mutwo {

// "2026-11-27 18:02" in `zone`; "-" for 0 (unknown).
std::string DateTimeText(int64_t unix_ms, absl::TimeZone zone);

// How long before `now_ms` `unix_ms` was: "12s ago", "5m ago", "2h05m ago",
// "3d ago"; "-" for 0 (unknown); "just now" within a second or for a time
// ahead of `now_ms` (clocks of two machines).
std::string AgoText(int64_t unix_ms, int64_t now_ms);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_TIME_TEXT_H_
