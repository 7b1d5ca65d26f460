#include "client/text_table.h"

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

TEST(TextTable, ColumnsAreAsWideAsTheirWidestCell) {
  TextTable t({"WORKER", "STATE", "MEMORY"}, {false, false, true});
  t.AddRow({"worker-with-a-very-long-hostname-1234", "IDLE", "23.59 GiB"});
  t.AddRow({"w2", "BUSY", "512 B"});
  const std::string out = t.Render();
  EXPECT_EQ(out,
            "WORKER                                 STATE     MEMORY\n"
            "worker-with-a-very-long-hostname-1234  IDLE   23.59 GiB\n"
            "w2                                     BUSY       512 B\n");
  // Every column starts at the same offset on every line.
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  for (const std::string& line : lines) {
    EXPECT_EQ(line.find_first_of("IBS", 37), 39u) << line;
  }
}

TEST(TextTable, ShortRowsArePaddedAndNoTrailingBlanks) {
  TextTable t({"A", "B"});
  t.AddRow({"x"});
  EXPECT_EQ(t.Render(), "A  B\nx\n");
}

}  // namespace
}  // namespace mutwo
