// `ds41 serve`: the API over the HTTP front end (server/http_server.h) and the engine — OpenAI chat completions and
// completions, Anthropic messages, model list, health and Prometheus metrics.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "server/api_request.h"
#include "server/http_server.h"

namespace ds41 {

class Engine;
class TextSide;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;     // non-empty: every /v1 request needs "Authorization: Bearer <key>" (or x-api-key)
  std::string model_name;  // what /v1/models lists and responses carry
  ApiDefaults defaults;
  int64_t max_body_bytes = int64_t(64) << 20;
  HttpServerOptions http;  // limits and threads of the HTTP layer (its host, port and body limit are the above)
};

class Server {
 public:
  Server(Engine& engine, const TextSide& text, ServerOptions opt);
  ~Server();
  // Binds and serves until stop(); returns false (with `error`) if the address cannot be bound.
  bool listen(std::string& error);
  // listen() in two steps: bind (false with `error` set when the address is not available), then
  // serve until stop(); what is printed between them is true (the port is ours).
  bool bind(std::string& error);
  // Binds to an ephemeral port first (for tests): returns the port, or -1.
  int bind_any_port();
  bool listen_after_bind();
  int port() const;
  // Stops accepting; answers in progress may finish within `grace`, then end with an error the
  // client can read ("the server is shutting down"); listen() returns when all are closed.
  void drain(std::chrono::milliseconds grace);
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds41
