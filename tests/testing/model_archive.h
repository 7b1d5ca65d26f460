// Test helper: model bytes that mutwo-server's check at submit
// (common/model_archive.h) accepts without LibTorch: a zip archive shaped
// as torch.jit.save writes one (ROOT/data.pkl, ROOT/code/...), whose data.pkl
// names no class, so forward's arguments are unknown and any inputs pass,
// as they do for a model the check cannot read. For tests of the service
// (jobs, leases, reports) whose workers are fakes that never load the
// model; `tag` makes the bytes (and so the sha256) differ.
#ifndef MUTWO_TESTS_TESTING_MODEL_ARCHIVE_H_
#define MUTWO_TESTS_TESTING_MODEL_ARCHIVE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mutwo::testing {

inline uint32_t Crc32(const std::string& bytes) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : bytes) {
    crc ^= c;
    for (int k = 0; k < 8; ++k)
      crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// A zip of stored records (no compression), little-endian as the format is.
inline std::string StoredZip(
    const std::vector<std::pair<std::string, std::string>>& records) {
  auto le = [](std::string& out, uint64_t value, int width) {
    for (int i = 0; i < width; ++i)
      out.push_back(static_cast<char>(value >> (8 * i)));
  };
  std::string zip, directory;
  for (const auto& [name, data] : records) {
    const uint32_t offset = static_cast<uint32_t>(zip.size());
    const uint32_t crc = Crc32(data);
    le(zip, 0x04034b50, 4);
    le(zip, 20, 2);  // version needed
    le(zip, 0, 2);   // flags
    le(zip, 0, 2);   // stored
    le(zip, 0, 4);   // time, date
    le(zip, crc, 4);
    le(zip, data.size(), 4);
    le(zip, data.size(), 4);
    le(zip, name.size(), 2);
    le(zip, 0, 2);
    zip += name;
    zip += data;
    le(directory, 0x02014b50, 4);
    le(directory, 20, 2);  // made by
    le(directory, 20, 2);  // needed
    le(directory, 0, 2);
    le(directory, 0, 2);
    le(directory, 0, 4);
    le(directory, crc, 4);
    le(directory, data.size(), 4);
    le(directory, data.size(), 4);
    le(directory, name.size(), 2);
    le(directory, 0, 2);  // extra
    le(directory, 0, 2);  // comment
    le(directory, 0, 2);  // disk
    le(directory, 0, 2);  // internal attributes
    le(directory, 0, 4);  // external attributes
    le(directory, offset, 4);
    directory += name;
  }
  const uint32_t directory_offset = static_cast<uint32_t>(zip.size());
  zip += directory;
  le(zip, 0x06054b50, 4);
  le(zip, 0, 4);  // disks
  le(zip, records.size(), 2);
  le(zip, records.size(), 2);
  le(zip, directory.size(), 4);
  le(zip, directory_offset, 4);
  le(zip, 0, 2);  // comment
  return zip;
}

inline std::string UncheckedModelArchive(const std::string& tag) {
  return StoredZip({{"model/data.pkl", "\x80\x02}."},
                    {"model/code/__torch__.py", "# " + tag + "\n"},
                    {"model/version", "3"}});
}

// An archive whose top-level class `__torch__.M` declares `parameters`
// (after self) as its forward's, e.g. "x: Tensor, y: Optional[Tensor]=None":
// what torch.jit.save writes, reduced to what the check reads.
inline std::string ModelArchiveWithForward(const std::string& parameters) {
  return StoredZip(
      {{"m/data.pkl",
        "\x80\x02"
        "c__torch__\nM\n)\x81}b."},
       {"m/code/__torch__.py",
        "class M(Module):\n  __parameters__ = []\n  training : bool\n"
        "  def forward(self: __torch__.M,\n    " +
            parameters + ") -> Tensor:\n    return x\n"},
       {"m/version", "3"}});
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_MODEL_ARCHIVE_H_
