#include "common/proto_io.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace mutwo {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// `snake_case` as protobuf's JSON name (`snakeCase`), which the parser
// accepts as well.
std::string JsonName(const std::string& name) {
  std::string out;
  bool upper = false;
  for (char c : name) {
    if (c == '_') {
      upper = true;
    } else {
      out += upper ? absl::ascii_toupper(c) : c;
      upper = false;
    }
  }
  return out;
}

bool IsReservedKey(const Descriptor& descriptor, const std::string& key) {
  for (int i = 0; i < descriptor.reserved_name_count(); ++i) {
    const std::string& name = descriptor.reserved_name(i);
    if (key == name || key == JsonName(name)) return true;
  }
  return false;
}

// The field a JSON member names: its proto name or its JSON name.
const FieldDescriptor* FieldNamed(const Descriptor& descriptor,
                                  const std::string& key) {
  if (const FieldDescriptor* field = descriptor.FindFieldByName(key)) {
    return field;
  }
  for (int i = 0; i < descriptor.field_count(); ++i) {
    if (descriptor.field(i)->json_name() == key) return descriptor.field(i);
  }
  return nullptr;
}

int DropReservedKeys(const Descriptor& descriptor,
                     google::protobuf::Struct* object);

// `value` is the JSON of a `type` message (or a list of them); the
// well-known types have JSON forms of their own and no reserved names.
int DropReservedKeysInValue(const Descriptor& type,
                            google::protobuf::Value* value) {
  if (type.file()->package() == "google.protobuf") return 0;
  int dropped = 0;
  if (value->has_struct_value()) {
    dropped += DropReservedKeys(type, value->mutable_struct_value());
  } else if (value->has_list_value()) {
    for (google::protobuf::Value& element :
         *value->mutable_list_value()->mutable_values()) {
      if (element.has_struct_value()) {
        dropped += DropReservedKeys(type, element.mutable_struct_value());
      }
    }
  }
  return dropped;
}

// Removes the members of `object` (the JSON of a `descriptor` message, and
// of the messages in it) that name a reserved field: a field removed from
// the API, which JSON written before the removal still has. Returns how
// many it removed.
int DropReservedKeys(const Descriptor& descriptor,
                     google::protobuf::Struct* object) {
  int dropped = 0;
  auto& members = *object->mutable_fields();
  for (auto it = members.begin(); it != members.end();) {
    if (IsReservedKey(descriptor, it->first)) {
      it = members.erase(it);
      ++dropped;
      continue;
    }
    const FieldDescriptor* field = FieldNamed(descriptor, it->first);
    if (field != nullptr && field->is_map()) {
      const FieldDescriptor* map_value = field->message_type()->map_value();
      if (map_value->message_type() != nullptr &&
          it->second.has_struct_value()) {
        for (auto& [key, entry] :
             *it->second.mutable_struct_value()->mutable_fields()) {
          dropped +=
              DropReservedKeysInValue(*map_value->message_type(), &entry);
        }
      }
    } else if (field != nullptr && field->message_type() != nullptr) {
      dropped += DropReservedKeysInValue(*field->message_type(), &it->second);
    }
    ++it;
  }
  return dropped;
}

}  // namespace

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
    errno = 0;
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      // errno names the cause (ENOSPC, EDQUOT, EIO); the partial file goes,
      // so a full disk leaves nothing half-written behind.
      const std::string why =
          errno != 0 ? std::strerror(errno) : "stream error";
      out.close();
      std::remove(tmp.c_str());
      return absl::DataLossError(absl::StrCat("file \"", tmp, "\": write of ",
                                              bytes.size(),
                                              " bytes failed: ", why));
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
    // Written by a version that still had a field now reserved (e.g. a
    // stored profile with Activation.occurrence): read it without those
    // members. Any other unknown member is still an error.
    google::protobuf::Value tree;
    if (google::protobuf::util::JsonStringToMessage(
            google::protobuf::StringPiece(json.data(), json.size()), &tree)
            .ok() &&
        tree.has_struct_value() &&
        DropReservedKeys(*message->GetDescriptor(),
                         tree.mutable_struct_value()) > 0) {
      std::string without;
      if (google::protobuf::util::MessageToJsonString(tree, &without).ok()) {
        message->Clear();
        status = google::protobuf::util::JsonStringToMessage(without, message,
                                                             options);
      }
    }
  }
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
