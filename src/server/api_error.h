// An error answered to an API client: HTTP status + OpenAI-style error object
// {"error": {"message", "type", "param", "code"}} (the Anthropic endpoint re-wraps it in its own
// {"type": "error", "error": {"type", "message"}} shape).
#pragma once

#include <stdexcept>
#include <string>

namespace ds41 {

struct ApiError : std::runtime_error {
  int status;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, server_error...
  std::string param;  // the offending field, dotted ("messages[2].content"), may be empty
  ApiError(int status_, std::string type_, const std::string& message, std::string param_ = {})
      : std::runtime_error(message), status(status_), type(std::move(type_)), param(std::move(param_)) {}
};

inline ApiError bad_request(const std::string& message, const std::string& param = {}) {
  return ApiError(400, "invalid_request_error", message, param);
}

}  // namespace ds41
