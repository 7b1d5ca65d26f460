#include "server/upload_sessions.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mutwo {

UploadSession::UploadSession(int64_t max_model_bytes, OpenFile open_file,
                             std::function<absl::Status(int64_t)> admit,
                             std::function<void()> done)
    : max_model_bytes_(max_model_bytes),
      open_file_(std::move(open_file)),
      admit_(std::move(admit)),
      done_(std::move(done)) {}

UploadSession::~UploadSession() {
  if (done_) done_();
}

absl::Status UploadSession::Header(const v1::UploadModelHeader& header) {
  if (has_header_) {
    return absl::InvalidArgumentError("upload: a second header was sent");
  }
  if (!IsSha256Hex(header.sha256())) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload: sha256 \"", header.sha256().substr(0, 80),
                     "\" is not 64 lowercase hex digits"));
  }
  if (header.size_bytes() <= 0) {
    return absl::InvalidArgumentError(
        "upload: declared size_bytes must be positive");
  }
  if (header.size_bytes() > max_model_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("upload: model of ", header.size_bytes(),
                     " bytes is over the limit of ", max_model_bytes_,
                     " bytes (--max_model_bytes)"));
  }
  if (admit_) {
    MUTWO_RETURN_IF_ERROR(admit_(header.size_bytes()));
  }
  if (open_file_) {
    MUTWO_ASSIGN_OR_RETURN(file_, open_file_());
  }
  header_ = header;
  has_header_ = true;
  return absl::OkStatus();
}

absl::Status UploadSession::Chunk(const std::string& bytes) {
  if (!has_header_) {
    return absl::InvalidArgumentError(
        "upload: the first message must carry the header");
  }
  if (static_cast<int64_t>(bytes.size()) > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload: chunk of ", bytes.size(), " bytes is over the 1 MiB limit"));
  }
  const int64_t total = received_ + static_cast<int64_t>(bytes.size());
  if (total > header_.size_bytes()) {
    const std::string msg =
        absl::StrCat("upload: received more than the declared ",
                     header_.size_bytes(), " bytes");
    return total > max_model_bytes_ ? absl::ResourceExhaustedError(msg)
                                    : absl::InvalidArgumentError(msg);
  }
  sha_.Update(bytes);
  if (file_ != nullptr) {
    MUTWO_RETURN_IF_ERROR(file_->Append(bytes));
  }
  received_ = total;
  return absl::OkStatus();
}

absl::Status UploadSession::Finish() {
  if (!has_header_) return absl::InvalidArgumentError("upload: no header sent");
  if (received_ != header_.size_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload: declared ", header_.size_bytes(),
                     " bytes but received ", received_));
  }
  const std::string got = sha_.HexDigest();
  if (got != header_.sha256()) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload: declared sha256 ", header_.sha256(),
                     " but the bytes hash to ", got));
  }
  return absl::OkStatus();
}

int64_t UploadSessions::MaxBytesPerClient() const {
  return options_.max_upload_bytes_per_client > 0
             ? options_.max_upload_bytes_per_client
             : 2 * options_.max_model_bytes;
}

absl::StatusOr<std::unique_ptr<UploadSession>> UploadSessions::Open(
    const std::string& principal) {
  {
    absl::MutexLock lock(&mu_);
    ClientUploads& mine = uploads_[principal];
    if (mine.running >= options_.max_uploads_per_client) {
      return absl::ResourceExhaustedError(
          absl::StrCat("upload: ", mine.running,
                       " uploads of this client are running, "
                       "the limit is ",
                       options_.max_uploads_per_client,
                       " (--max_uploads_per_client); retry when one ended"));
    }
    ++mine.running;
  }
  // What Header() admitted, given back when the session ends.
  auto admitted = std::make_shared<int64_t>(0);
  return std::make_unique<UploadSession>(
      options_.max_model_bytes, [this] { return store_->NewModelFile(); },
      [this, principal, admitted](int64_t declared) {
        MUTWO_RETURN_IF_ERROR(Admit(principal, declared));
        *admitted = declared;
        return absl::OkStatus();
      },
      [this, principal, admitted] { End(principal, *admitted); });
}

absl::Status UploadSessions::Admit(const std::string& principal,
                                   int64_t declared) {
  const int64_t max_bytes = MaxBytesPerClient();
  absl::MutexLock lock(&mu_);
  ClientUploads& mine = uploads_[principal];
  if (mine.declared_bytes + declared > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "upload: this client's running uploads declare ", mine.declared_bytes,
        " bytes; ", declared, " more would pass the limit of ", max_bytes,
        " bytes (--max_upload_bytes_per_client)"));
  }
  mine.declared_bytes += declared;
  return absl::OkStatus();
}

void UploadSessions::End(const std::string& principal, int64_t admitted) {
  absl::MutexLock lock(&mu_);
  auto it = uploads_.find(principal);
  if (it == uploads_.end()) return;
  it->second.declared_bytes -= admitted;
  if (--it->second.running <= 0) uploads_.erase(it);
}

}  // namespace mutwo
