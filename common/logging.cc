#include "common/logging.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace mutwo {

absl::Status InitLogging(absl::string_view program, absl::string_view level) {
  // Any case: --log_level=DEBUG works like debug.
  const std::string lower = absl::AsciiStrToLower(level);
  const spdlog::level::level_enum lvl = spdlog::level::from_str(lower);
  if (lvl == spdlog::level::off && lower != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("log level \"", level,
                     "\": use trace, debug, info, warn, error or off"));
  }
  auto logger = spdlog::stderr_logger_mt(std::string(program));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n] %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace mutwo
