#include "client/text_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace mutwo {
namespace {

// Display width: UTF-8 continuation bytes take no column (μ, ×).
size_t Width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

TextTable::TextTable(std::vector<std::string> header, std::vector<bool> right)
    : right_(std::move(right)) {
  right_.resize(header.size(), false);
  rows_.push_back(std::move(header));
}

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(rows_.front().size());
  rows_.push_back(std::move(cells));
}

std::string TextTable::Render() const {
  std::vector<size_t> widths(rows_.front().size(), 0);
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], Width(row[i]));
    }
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string pad(widths[i] - Width(row[i]), ' ');
      absl::StrAppend(
          &line, i == 0 ? "" : "  ",
          right_[i] ? absl::StrCat(pad, row[i]) : absl::StrCat(row[i], pad));
    }
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return out;
}

}  // namespace mutwo
