#include "client/floor_text.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/parse.h"

namespace mutwo {

std::string FloorText(const v1::BatchResult& r) {
  if (r.measured_floor_bytes() > 0) {
    return absl::StrCat(FormatBytes(r.measured_floor_bytes()), " measured");
  }
  int64_t over = 0;
  for (const v1::BudgetOutcome& o : r.outcomes()) {
    if (o.state() == v1::BudgetOutcome::OVER_BUDGET) {
      over = std::max(over, o.budget_bytes());
    }
  }
  if (over > 0 && over >= r.floor_bytes()) {
    return absl::StrCat("> ", FormatBytes(over), " measured");
  }
  return absl::StrCat(FormatBytes(r.floor_bytes()), " predicted");
}

}  // namespace mutwo
