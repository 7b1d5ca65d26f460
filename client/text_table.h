// A table for people: columns as wide as their widest cell (header
// included), two spaces apart, numbers right-aligned where asked, no
// trailing blanks. Used by `mutwo workers`, `jobs` and `job`.
#ifndef MUTWO_CLIENT_TEXT_TABLE_H_
#define MUTWO_CLIENT_TEXT_TABLE_H_

#include <string>
#include <vector>

namespace mutwo {

class TextTable {
 public:
  // `right[i]`: column i is right-aligned (missing entries: left).
  explicit TextTable(std::vector<std::string> header,
                     std::vector<bool> right = {});

  // A row with fewer cells than the header is padded with empty cells.
  void AddRow(std::vector<std::string> cells);
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;  // rows_[0] is the header
  std::vector<bool> right_;
};

}  // namespace mutwo

#endif  // MUTWO_CLIENT_TEXT_TABLE_H_
