#include "common/model_archive.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/parse.h"
#include "common/zip_archive.h"

namespace mutwo {
namespace {

constexpr char kPickleNotTorchScript[] =
    "this is a torch.save pickle (a pickled module or state dict), not "
    "TorchScript: save the model with torch.jit.script(model).save(path), "
    "or torch.jit.trace(model, example_inputs).save(path) when it does not "
    "script";
// Code records are source text: more than this is not read.
constexpr uint64_t kMaxCodeRecordBytes = uint64_t{64} << 20;
// data.pkl's first opcodes are read; the record may be large.
constexpr uint64_t kMaxPickleRecordBytes = uint64_t{256} << 20;

ForwardSchema Unknown(std::string reason) {
  ForwardSchema schema;
  schema.unknown_reason = std::move(reason);
  return schema;
}

// The class pickled first in data.pkl: `\x80\x02c<module>\n<name>\n`
// (protocol 2, GLOBAL), as torch.jit.save writes it.
absl::StatusOr<std::pair<std::string, std::string>> FirstGlobal(
    absl::string_view pickle) {
  if (pickle.size() < 3 || static_cast<unsigned char>(pickle[0]) != 0x80 ||
      pickle[2] != 'c') {
    return absl::UnimplementedError("data.pkl does not start with a GLOBAL");
  }
  const size_t module_end = pickle.find('\n', 3);
  if (module_end == absl::string_view::npos) {
    return absl::UnimplementedError("data.pkl's GLOBAL has no module");
  }
  const size_t name_end = pickle.find('\n', module_end + 1);
  if (name_end == absl::string_view::npos) {
    return absl::UnimplementedError("data.pkl's GLOBAL has no name");
  }
  return std::make_pair(
      std::string(pickle.substr(3, module_end - 3)),
      std::string(pickle.substr(module_end + 1, name_end - module_end - 1)));
}

bool IsIdentifier(absl::string_view text) {
  if (text.empty() || absl::ascii_isdigit(text[0])) return false;
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
}

// Calls `visit(i, c, depth)` for each character of `text` from `from` on
// that lies outside string literals, `depth` being the bracket depth before
// it; returns the first position where `visit` returns true (npos: none).
template <typename Visit>
size_t ScanCode(absl::string_view text, size_t from, Visit visit) {
  int depth = 0;
  char quote = 0;
  for (size_t i = from; i < text.size(); ++i) {
    const char c = text[i];
    if (quote != 0) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if (c == '"' || c == '\'') {
      quote = c;
      continue;
    }
    if (visit(i, c, depth)) return i;
    if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if (c == ')' || c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::string_view::npos;
}

// The text between the parenthesis at `open` and its match, and the
// top-level commas' positions in it; nullopt when it does not close.
// Brackets inside string literals do not count.
struct Parenthesised {
  absl::string_view inside;
  std::vector<absl::string_view> parts;  // split at top-level commas
};
std::optional<Parenthesised> SplitParenthesised(absl::string_view text,
                                                size_t open) {
  size_t part_start = open + 1;
  Parenthesised out;
  const size_t close = ScanCode(text, open, [&](size_t i, char c, int depth) {
    if (depth != 1) return false;
    if (c == ')' || c == ']' || c == '}') return true;
    if (c == ',') {
      out.parts.push_back(text.substr(part_start, i - part_start));
      part_start = i + 1;
    }
    return false;
  });
  if (close == absl::string_view::npos) return std::nullopt;
  out.parts.push_back(text.substr(part_start, close - part_start));
  out.inside = text.substr(open + 1, close - open - 1);
  return out;
}

// The first `target` at bracket depth 0 outside string literals.
size_t FindTopLevel(absl::string_view text, char target) {
  return ScanCode(text, 0, [target](size_t, char c, int depth) {
    return c == target && depth == 0;
  });
}

// forward's arguments in the code of class `name`: the class starts at a
// line `class NAME(` and ends at the next line that is not indented.
ForwardSchema ForwardOfClass(absl::string_view code, absl::string_view name) {
  const std::string header = absl::StrCat("class ", name, "(");
  size_t class_at =
      absl::StartsWith(code, header) ? 0 : code.find("\n" + header);
  if (class_at == absl::string_view::npos) {
    return Unknown(absl::StrCat("no `class ", name, "` in its code"));
  }
  if (code[class_at] == '\n') ++class_at;
  size_t class_end = class_at;
  while (true) {
    class_end = code.find('\n', class_end);
    if (class_end == absl::string_view::npos) {
      class_end = code.size();
      break;
    }
    ++class_end;
    if (class_end < code.size() && code[class_end] != ' ' &&
        code[class_end] != '\n') {
      break;
    }
  }
  const absl::string_view body = code.substr(class_at, class_end - class_at);
  constexpr absl::string_view kDef = "\n  def forward(";
  const size_t def = body.find(kDef);
  if (def == absl::string_view::npos) {
    return Unknown(absl::StrCat("class ", name, " defines no forward"));
  }
  const auto parameters = SplitParenthesised(body, def + kDef.size() - 1);
  if (!parameters.has_value() || parameters->parts.empty()) {
    return Unknown("forward's parameter list does not close");
  }
  ForwardSchema schema;
  for (size_t i = 0; i < parameters->parts.size(); ++i) {
    const absl::string_view part =
        absl::StripAsciiWhitespace(parameters->parts[i]);
    const size_t colon = FindTopLevel(part, ':');
    const absl::string_view argument_name = absl::StripAsciiWhitespace(
        colon == absl::string_view::npos ? part : part.substr(0, colon));
    if (i == 0) {
      if (argument_name != "self") {
        return Unknown("forward's first parameter is not self");
      }
      continue;
    }
    if (colon == absl::string_view::npos || !IsIdentifier(argument_name)) {
      return Unknown(absl::StrCat("forward's parameter `", part,
                                  "` is not `NAME: TYPE[=DEFAULT]`"));
    }
    const absl::string_view rest = part.substr(colon + 1);
    const size_t equals = FindTopLevel(rest, '=');
    ForwardArgument argument;
    argument.name = std::string(argument_name);
    argument.type = std::string(absl::StripAsciiWhitespace(
        equals == absl::string_view::npos ? rest : rest.substr(0, equals)));
    if (argument.type.empty()) {
      return Unknown(
          absl::StrCat("forward's parameter ", argument.name, " has no type"));
    }
    if (equals != absl::string_view::npos) {
      argument.default_value =
          std::string(absl::StripAsciiWhitespace(rest.substr(equals + 1)));
    }
    schema.arguments.push_back(std::move(argument));
  }
  schema.known = true;
  return schema;
}

// The archive's records by name, and its root folder (torch.jit.save puts
// every record under one: `NAME/data.pkl`, `NAME/code/...`).
const ZipRecord* FindRecord(const std::vector<ZipRecord>& records,
                            absl::string_view name) {
  for (const ZipRecord& record : records) {
    if (record.name == name) return &record;
  }
  return nullptr;
}

absl::Status Refuse(absl::string_view what, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("model ", what, ": ", message));
}

}  // namespace

absl::Status CheckModelArchive(absl::string_view bytes,
                               absl::string_view what) {
  // A zip archive starts with a local file header and ends with a 22-byte
  // end-of-central-directory record.
  constexpr size_t kMinZipBytes = 22;
  if (bytes.empty()) return Refuse(what, "the file is empty");
  // torch.save's legacy format is a bare pickle (protocol 2: 0x80 0x02).
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x80 &&
      static_cast<unsigned char>(bytes[1]) <= 5) {
    return Refuse(what, kPickleNotTorchScript);
  }
  if (bytes.size() < kMinZipBytes || bytes.substr(0, 4) != "PK\x03\x04") {
    return Refuse(what,
                  "not a TorchScript archive (not a zip file; save it with "
                  "torch.jit.script(model).save(path))");
  }
  // torch::jit::load allocates and inflates every record whole: a few MiB
  // of deflated zeros become GiBs of memory before anything can check
  // them. torch.jit.save stores tensor records uncompressed, so a real
  // model inflates to about its own size.
  const absl::StatusOr<ZipInflation> inflation = ReadZipInflation(bytes);
  if (!inflation.ok()) {
    return Refuse(what, absl::StrCat("cannot load the TorchScript archive "
                                     "(truncated or corrupt?): ",
                                     inflation.status().message()));
  }
  if (inflation->has_data_pickle && !inflation->has_code) {
    return Refuse(what, kPickleNotTorchScript);
  }
  const int64_t allowed =
      std::max<int64_t>(kMaxInflationRatio * static_cast<int64_t>(bytes.size()),
                        kMinInflationAllowanceBytes);
  if (inflation->uncompressed_bytes > allowed) {
    return Refuse(
        what,
        absl::StrCat("refused as a zip bomb: the archive inflates to ",
                     FormatBytes(inflation->uncompressed_bytes), " from ",
                     FormatBytes(static_cast<int64_t>(bytes.size())),
                     " (torch.jit.save stores tensors uncompressed, so a model "
                     "inflates to about its file size; at most ",
                     kMaxInflationRatio, "x or ",
                     FormatBytes(kMinInflationAllowanceBytes), " is loaded)"));
  }
  return absl::OkStatus();
}

ForwardSchema ReadForwardSchema(absl::string_view bytes) {
  absl::StatusOr<std::vector<ZipRecord>> records = ListZipRecords(bytes);
  if (!records.ok()) return Unknown(std::string(records.status().message()));
  const ZipRecord* data = nullptr;
  for (const ZipRecord& record : *records) {
    const std::vector<absl::string_view> parts =
        absl::StrSplit(record.name, '/');
    if (parts.size() == 2 && parts[1] == "data.pkl") {
      data = &record;
      break;
    }
  }
  if (data == nullptr) return Unknown("no ROOT/data.pkl record");
  const std::string root = data->name.substr(0, data->name.find('/'));
  absl::StatusOr<std::string> pickle =
      ReadZipRecord(bytes, *data, kMaxPickleRecordBytes);
  if (!pickle.ok()) return Unknown(std::string(pickle.status().message()));
  absl::StatusOr<std::pair<std::string, std::string>> global =
      FirstGlobal(*pickle);
  if (!global.ok()) return Unknown(std::string(global.status().message()));
  const auto& [module, name] = *global;
  if (!absl::StartsWith(module, "__torch__")) {
    return Unknown(absl::StrCat("data.pkl's class ", module, ".", name,
                                " is not TorchScript's (__torch__)"));
  }
  const std::string code_name = absl::StrCat(
      root, "/code/", absl::StrReplaceAll(module, {{".", "/"}}), ".py");
  const ZipRecord* code = FindRecord(*records, code_name);
  if (code == nullptr) return Unknown(absl::StrCat("no record ", code_name));
  absl::StatusOr<std::string> text =
      ReadZipRecord(bytes, *code, kMaxCodeRecordBytes);
  if (!text.ok()) return Unknown(std::string(text.status().message()));
  ForwardSchema schema = ForwardOfClass(*text, name);
  schema.class_name = absl::StrCat(module, ".", name);
  return schema;
}

absl::Status CheckModelInputs(absl::string_view bytes, absl::string_view what,
                              const std::vector<v1::TensorSpec>& inputs,
                              ForwardSchema* schema_out) {
  if (absl::Status s = CheckModelArchive(bytes, what); !s.ok()) return s;
  ForwardSchema schema = ReadForwardSchema(bytes);
  if (schema.known) {
    absl::StatusOr<std::vector<int>> bound =
        BindSpecsToArguments(schema.arguments, inputs);
    if (!bound.ok()) return Refuse(what, bound.status().message());
  }
  if (schema_out != nullptr) *schema_out = std::move(schema);
  return absl::OkStatus();
}

absl::Status CheckModelFileInputs(const std::string& path,
                                  absl::string_view what,
                                  const std::vector<v1::TensorSpec>& inputs,
                                  ForwardSchema* schema) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return absl::InternalError(
        absl::StrCat("cannot stat ", path, ": ", std::strerror(error)));
  }
  const size_t size = static_cast<size_t>(info.st_size);
  if (size == 0) {
    close(fd);
    return CheckModelInputs(absl::string_view(), what, inputs, schema);
  }
  void* mapped = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int error = errno;
  close(fd);
  if (mapped == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("cannot map ", path, ": ", std::strerror(error)));
  }
  absl::Status status = CheckModelInputs(
      absl::string_view(static_cast<const char*>(mapped), size), what, inputs,
      schema);
  munmap(mapped, size);
  return status;
}

}  // namespace mutwo
