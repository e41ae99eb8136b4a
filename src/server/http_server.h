// The HTTP/1.1 front end of `ds41 serve` (Boost.Beast over Asio): a few I/O threads multiplex
// every connection, so a slow or hostile client costs a socket and a bounded buffer, never a
// thread. What it enforces, whatever the handlers do:
//   - a request head of at most `header_limit` bytes and `max_header_fields` lines (431), a body
//     of at most `max_body_bytes` (413), the whole request within `request_timeout_s` (then the
//     connection is closed: a slowloris client holds nothing for long);
//   - strict framing: Content-Length together with Transfer-Encoding, conflicting Content-Lengths,
//     a transfer coding other than chunked, whitespace before a header's colon: 400 and the
//     connection closed (nothing after a doubtful boundary is read as a request);
//   - pipelined requests answered in order; `max_connections` open at once (the one that has
//     waited longest for its request is closed to make room, else 503);
//   - a client that goes away while its answer is made is noticed at once (a read-side watch on
//     the socket, not a failed write), and the answer is cancelled;
//   - drain(): no new connections, requests that arrive get 503, answers in progress may finish
//     until the grace period ends, then they are cancelled with a reason the client can read.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace ds41 {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  std::string path;    // the target without its query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::chrono::steady_clock::time_point arrived;  // when its head had been read
  // The first header of that name (case-insensitive), or "".
  std::string header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

// An answer made over time (a generation). Every call comes from the connection's strand, one at
// a time; `wake` may be called from any thread.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  struct Output {
    std::optional<HttpResponse> head;  // given once: the status and headers (and the whole body unless streamed)
    bool streamed = false;             // with `head`: the body follows in `data`, sent as it comes
    std::string data;                  // streamed body bytes
    bool finished = false;             // nothing more will come
  };
  // Called once when the answer may start; `wake` asks for a poll() (call it when there is news).
  virtual void start(std::function<void()> wake) = 0;
  // Never blocks: what is ready now.
  virtual Output poll() = 0;
  // The client went away (`reason` empty: nothing will be sent) or the server is shutting down
  // (`reason` says so; the answer should end soon, telling the client why, and poll() is still called).
  virtual void cancel(const std::string& reason) = 0;
};

using HttpReply = std::variant<HttpResponse, std::shared_ptr<HttpResponder>>;
using HttpHandler = std::function<HttpReply(const HttpRequest&)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  int io_threads = 2;        // threads multiplexing the sockets (handlers marked quick run here)
  int worker_threads = 2;    // threads for handlers that parse, tokenize or decode images
  size_t header_limit = 32 << 10;
  int max_header_fields = 128;
  int64_t max_body_bytes = int64_t(64) << 20;
  int request_timeout_s = 30;  // a whole request (head and body) must arrive within this
  int write_timeout_s = 60;    // a client that reads nothing for this long is gone
  int max_connections = 1024;
  // Origins allowed to call the server from a browser (CORS): "*" for any; empty (default): no
  // CORS headers, and OPTIONS is a method like any other (405 where a path does not route it).
  std::vector<std::string> cors_origins;
};

struct HttpServerStats {
  int64_t connections = 0;           // accepted
  int64_t refused_connections = 0;   // answered 503 at max_connections
  int64_t evicted_connections = 0;   // closed to make room for a new one
  int64_t protocol_errors = 0;       // malformed, oversized or ill-framed requests
  int64_t timeouts = 0;              // requests not received within request_timeout_s
  int64_t disconnects = 0;           // answers cancelled because the client went away
  int64_t open_connections = 0;
};

class HttpServer {
 public:
  // The body of an error the HTTP layer answers itself (400, 404, 405, 413, 431, 500, 503, ...);
  // `req` is null when the request could not be parsed.
  using ErrorMaker = std::function<HttpResponse(const HttpRequest* req, int status, const std::string& message)>;
  using Gate = std::function<std::optional<HttpResponse>(const HttpRequest&)>;

  HttpServer(HttpServerOptions opt, ErrorMaker errors);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // `blocking` handlers run on a worker thread; the others on an I/O thread (they must be quick).
  void route(const std::string& method, const std::string& path, HttpHandler handler, bool blocking = false);
  // Paths that start with `prefix` and go on (GET /v1/models/{id}), where no exact route matches.
  void route_prefix(const std::string& method, const std::string& prefix, HttpHandler handler, bool blocking = false);
  // Runs before routing; a response ends the request there (authentication).
  void set_gate(Gate gate);

  // Binds and listens on the options' host and port (or `port`; 0: an ephemeral one); false with
  // `error` when the address is taken or not available.
  bool bind(std::string& error, std::optional<int> port = std::nullopt);
  int port() const;
  // Serves until stop(), or until a drain() has finished; returns then.
  void run();
  // Stops accepting and answers what arrives with 503; answers in progress may finish until
  // `grace` has passed, then are cancelled with "the server is shutting down"; run() returns
  // once every connection is closed (at most a few seconds after the grace period).
  void drain(std::chrono::milliseconds grace);
  // Stops now: run() returns; connections are closed when the server is destroyed.
  void stop();
  bool draining() const;
  HttpServerStats stats() const;

 private:
  friend class HttpConnection;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds41
