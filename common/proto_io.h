// Reading and writing files, and the JSON form of protos used by the CLIs and
// the offline commands (protobuf's JSON mapping, proto field names kept).
#ifndef MUTWO_COMMON_PROTO_IO_H_
#define MUTWO_COMMON_PROTO_IO_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace mutwo {

// Reads a whole file; `max_bytes` > 0 refuses larger files before reading.
[[nodiscard]] absl::StatusOr<std::string> ReadFile(const std::string& path,
                                                   int64_t max_bytes = 0);
// Writes to `path.tmp`, then renames, so readers never see half a file.
[[nodiscard]] absl::Status WriteFileAtomically(const std::string& path,
                                               absl::string_view bytes);

// Pretty JSON with proto field names and default values printed.
std::string ProtoToJson(const google::protobuf::Message& message,
                        bool pretty = true);
// Parses JSON into `message`; the error names `what` (e.g. the file). An
// unknown member is an error, except one that names a field the message
// reserves (removed from the API): JSON written before the removal loads.
[[nodiscard]] absl::Status ProtoFromJson(absl::string_view json,
                                         absl::string_view what,
                                         google::protobuf::Message* message);
// `text` as a JSON string literal, quotes included.
std::string JsonQuote(absl::string_view text);

[[nodiscard]] absl::Status ReadProtoJsonFile(
    const std::string& path, google::protobuf::Message* message);

}  // namespace mutwo

#endif  // MUTWO_COMMON_PROTO_IO_H_
