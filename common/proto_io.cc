#include "common/proto_io.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"

namespace mutwo {

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     int64_t max_bytes) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("file \"", path, "\": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("file \"", path, "\": not a regular file"));
  }
  if (max_bytes > 0 && st.st_size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("file \"", path, "\": ", st.st_size,
                     " bytes is over the limit of ", max_bytes, " bytes"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat(
        "file \"", path, "\": cannot open: ", std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::PermissionDeniedError(absl::StrCat(
          "file \"", tmp, "\": cannot create: ", std::strerror(errno)));
    }
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) {
      return absl::DataLossError(
          absl::StrCat("file \"", tmp, "\": write failed"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename \"", tmp, "\" to \"", path,
                                            "\": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string ProtoToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  if (pretty && (out.empty() || out.back() != '\n')) out += '\n';
  return out;
}

absl::Status ProtoFromJson(absl::string_view json, absl::string_view what,
                           google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), message,
      options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not a valid ", message->GetDescriptor()->name(),
                     " JSON: ", status.message().ToString()));
  }
  return absl::OkStatus();
}

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  out += "\"";
  return out;
}

absl::Status ReadProtoJsonFile(const std::string& path,
                               google::protobuf::Message* message) {
  auto text = ReadFile(path, int64_t{1} << 30);
  if (!text.ok()) return text.status();
  return ProtoFromJson(*text, absl::StrCat("file \"", path, "\""), message);
}

}  // namespace mutwo
