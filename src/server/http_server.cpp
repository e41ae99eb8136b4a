#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <map>
#include <mutex>
#include <sys/socket.h>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace ds41 {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (beast::iequals(k, beast::string_view(name.data(), name.size()))) return v;
  return {};
}

namespace {

// Header text from a handler never carries a line break (no response splitting).
std::string header_safe(std::string s) {
  s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return c == '\r' || c == '\n'; }), s.end());
  return s;
}

// The status line and headers; `content_length` < 0: chunked (HTTP/1.1) or until close (1.0).
// `cors_origin`: the Access-Control-Allow-Origin value for this request's origin, or "".
std::string wire_head(const HttpResponse& r, int64_t content_length, bool chunked, bool close,
                      const std::string& cors_origin) {
  const auto reason = http::obsolete_reason(http::int_to_status(unsigned(r.status)));
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + std::string(reason.data(), reason.size()) + "\r\n";
  out += "Content-Type: " + header_safe(r.content_type) + "\r\n";
  for (const auto& [k, v] : r.headers) out += header_safe(k) + ": " + header_safe(v) + "\r\n";
  if (!cors_origin.empty()) {
    out += "Access-Control-Allow-Origin: " + header_safe(cors_origin) + "\r\n";
    if (cors_origin != "*") out += "Vary: Origin\r\n";
  }
  if (content_length >= 0) out += "Content-Length: " + std::to_string(content_length) + "\r\n";
  else if (chunked) out += "Transfer-Encoding: chunked\r\n";
  if (close) out += "Connection: close\r\n";
  return out + "\r\n";
}

// Runs the I/O loop until it stops. An exception out of a handler (what it could not foresee:
// allocation failure, a bug) ends that handler's connection only: it is logged and the loop goes
// on, as Asio allows, instead of ending the process.
void run_io(asio::io_context& ioc) {
  for (;;) {
    try {
      ioc.run();
      return;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ds41 serve: a connection handler failed: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "ds41 serve: a connection handler failed\n");
    }
  }
}

std::string chunk(const std::string& data) {
  char size[24];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}

}  // namespace

// Wakes come from other threads (the engine's) at any time; once the server is being destroyed
// they must not touch its I/O context. Each wake holds the gate while it posts.
struct WakeGate {
  std::mutex mu;
  bool open = true;
};

struct Route {
  std::string method, path;
  HttpHandler handler;
  bool blocking = false;
  bool prefix = false;  // matches paths that start with `path` (and go on), when no exact route does
};

class HttpConnection;

bool route_matches(const Route& r, const std::string& path) {
  return r.prefix ? path.size() > r.path.size() && path.compare(0, r.path.size(), r.path) == 0 : path == r.path;
}

struct HttpServer::Impl {
  HttpServerOptions opt;
  ErrorMaker errors;
  Gate gate;
  std::vector<Route> routes;
  // Declared before the I/O context: connections destroyed with its pending handlers unregister
  // themselves here.
  std::mutex mu;  // guards `open`
  std::map<HttpConnection*, std::weak_ptr<HttpConnection>> open;
  std::atomic<int64_t> n_connections{0}, n_refused{0}, n_evicted{0}, n_protocol{0}, n_timeouts{0}, n_disconnects{0};
  std::atomic<bool> draining{false};
  std::shared_ptr<WakeGate> wake_gate = std::make_shared<WakeGate>();

  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  asio::thread_pool workers;
  asio::steady_timer drain_timer{ioc};
  Clock::time_point drain_deadline{};
  bool drain_cancelled = false;

  Impl(HttpServerOptions o, ErrorMaker e)
      : opt(std::move(o)), errors(std::move(e)), workers(size_t(std::max(1, opt.worker_threads))) {}

  // The error maker's response, or a plain-text one if it throws: an error answer never fails.
  HttpResponse error(const HttpRequest* req, int status, const std::string& message) {
    try {
      return errors(req, status, message);
    } catch (const std::exception&) {
      return HttpResponse{status, "text/plain", {}, header_safe(message) + "\n"};
    }
  }

  void accept();
  void refuse(tcp::socket socket);
  bool evict_one();
  void drain_tick();
  std::vector<std::shared_ptr<HttpConnection>> connections() {
    std::vector<std::shared_ptr<HttpConnection>> out;
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [p, w] : open)
      if (auto c = w.lock()) out.push_back(std::move(c));
    return out;
  }
  int64_t open_count() {
    std::lock_guard<std::mutex> lock(mu);
    return int64_t(open.size());
  }
};

// One client connection: reads a request, answers it, reads the next (keep-alive, pipelining).
// Everything runs on the connection's strand.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(tcp::socket socket, HttpServer::Impl& srv) : srv_(srv), stream_(std::move(socket)) {}
  ~HttpConnection() {
    if (responder_ && !finished_) responder_->cancel("");
    std::lock_guard<std::mutex> lock(srv_.mu);
    srv_.open.erase(this);
  }

  void start() {
    {
      std::lock_guard<std::mutex> lock(srv_.mu);
      srv_.open[this] = weak_from_this();
    }
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // From other threads: close if this connection only waits for (or reads) a request.
  void close_if_reading() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->reading_) self->close();
    });
  }
  // Drain: idle connections close; those between requests close at the end of their answer.
  void on_drain() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->reading_ && self->buffer_.size() == 0 && !(self->parser_ && self->parser_->got_some())) self->close();
    });
  }
  // After the I/O threads have stopped (the server is being destroyed): close, cancel, let go.
  void abandon() {
    close();
    self_hold_.reset();
  }
  void cancel_answer(const std::string& reason) {
    asio::post(stream_.get_executor(), [self = shared_from_this(), reason] {
      if (self->responder_ && !self->finished_) self->responder_->cancel(reason);
    });
  }
  bool reading() const { return reading_; }
  Clock::time_point reading_since() const { return Clock::time_point(Clock::duration(reading_since_.load())); }

 private:
  void read_request() {
    if (closed_) return;
    if (srv_.draining && buffer_.size() == 0) return close();
    parser_.emplace();
    parser_->header_limit(std::uint32_t(srv_.opt.header_limit));
    parser_->body_limit(std::uint64_t(srv_.opt.max_body_bytes));
    reading_ = true;
    reading_since_ = Clock::now().time_since_epoch().count();
    stream_.expires_after(std::chrono::seconds(srv_.opt.request_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_header(ec);
    });
  }

  // A read failed: a closed keep-alive connection is normal; anything else is answered if the
  // client can still read it, and the connection is closed (its framing can no longer be trusted).
  void on_read_error(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == http::error::partial_message)
      return close();
    if (ec == beast::error::timeout) {
      ++srv_.n_timeouts;
      return close();
    }
    ++srv_.n_protocol;
    if (ec == http::error::header_limit)
      return fail(431, "the request head is over " + std::to_string(srv_.opt.header_limit) + " bytes");
    if (ec == http::error::body_limit)
      return fail(413, "the request body is over " + std::to_string(srv_.opt.max_body_bytes) + " bytes");
    fail(400, "malformed HTTP request (" + ec.message() + ")");
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    const auto& h = parser_->get();
    int fields = 0;
    for (auto it = h.begin(); it != h.end(); ++it) ++fields;
    if (fields > srv_.opt.max_header_fields) {
      ++srv_.n_protocol;
      return fail(431, "the request has " + std::to_string(fields) + " header lines; at most " +
                           std::to_string(srv_.opt.max_header_fields) + " are accepted");
    }
    // Only "chunked" is a transfer coding we read: with any other the body's end is unknown, and
    // guessing is how requests get smuggled.
    const auto te = h.find(http::field::transfer_encoding);
    if (te != h.end() && !beast::iequals(te->value(), "chunked")) {
      ++srv_.n_protocol;
      return fail(400, "unsupported Transfer-Encoding \"" + std::string(te->value()) + "\" (only chunked is accepted)");
    }
    if (h.version() != 10 && h.version() != 11) {
      ++srv_.n_protocol;
      return fail(505, "HTTP version not supported");
    }
    const std::string target(h.target());
    if (target.empty() || target[0] != '/') {
      ++srv_.n_protocol;
      return fail(400, "the request target must be a path");
    }
    arrived_ = Clock::now();
    const auto expect = h.find(http::field::expect);
    if (expect != h.end() && beast::iequals(expect->value(), "100-continue") && !parser_->is_done()) {
      out_ = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(out_), [self = shared_from_this()](beast::error_code e, size_t) {
        if (e) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    if (parser_->is_done()) return on_request();
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->on_read_error(ec);
      self->on_request();
    });
  }

  void on_request() {
    reading_ = false;
    stream_.expires_never();
    auto msg = parser_->release();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& f : msg) req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    req.body = std::move(msg.body());
    req.arrived = arrived_;
    http10_ = msg.version() == 10;
    keep_alive_ = msg.keep_alive();
    cors_origin_ = cors_allow_origin(req.header("Origin"));
    if (srv_.draining) {
      keep_alive_ = false;
      return send_whole(srv_.error(&req, 503, "the server is shutting down"));
    }
    // A browser's CORS preflight carries no credentials: answered before the gate.
    if (req.method == "OPTIONS" && !srv_.opt.cors_origins.empty()) return send_whole(preflight(req));
    if (srv_.gate) {
      std::optional<HttpResponse> stop;
      try {
        stop = srv_.gate(req);
      } catch (const std::exception& e) {
        stop = srv_.error(&req, 500, e.what());
      }
      if (stop) return send_whole(std::move(*stop));
    }
    const Route* route = nullptr;
    std::string allow;
    for (const bool by_prefix : {false, true}) {  // exact paths first
      for (const Route& r : srv_.routes) {
        if (r.prefix != by_prefix || !route_matches(r, req.path)) continue;
        if (r.method == req.method) route = &r;
        else allow += (allow.empty() ? "" : ", ") + r.method;
      }
      if (route || !allow.empty()) break;
    }
    if (!route && !allow.empty()) {
      HttpResponse e = srv_.error(&req, 405, req.method + " is not allowed on " + req.path + " (use " + allow + ")");
      e.headers.emplace_back("Allow", allow);
      return send_whole(std::move(e));
    }
    if (!route) return send_whole(srv_.error(&req, 404, "no such endpoint: " + req.method + " " + req.path));
    if (!route->blocking) return deliver(call(*route, req));
    asio::post(srv_.workers, [self = shared_from_this(), route, req = std::move(req)]() mutable {
      HttpReply reply = self->call(*route, req);
      asio::post(self->stream_.get_executor(), [self, reply = std::move(reply)]() mutable { self->deliver(std::move(reply)); });
    });
  }

  // The Access-Control-Allow-Origin a request from `origin` gets: "*" when every origin is
  // allowed, the origin itself when it is one of the allowed ones, else nothing.
  std::string cors_allow_origin(const std::string& origin) const {
    const std::vector<std::string>& allowed = srv_.opt.cors_origins;
    if (allowed.empty()) return "";
    if (std::find(allowed.begin(), allowed.end(), "*") != allowed.end()) return "*";
    if (origin.empty() || std::find(allowed.begin(), allowed.end(), origin) == allowed.end()) return "";
    return origin;
  }

  HttpResponse preflight(const HttpRequest& req) {
    std::string methods;
    for (const bool by_prefix : {false, true}) {
      for (const Route& r : srv_.routes)
        if (r.prefix == by_prefix && route_matches(r, req.path)) methods += (methods.empty() ? "" : ", ") + r.method;
      if (!methods.empty()) break;
    }
    if (methods.empty()) return srv_.error(&req, 404, "no such endpoint: " + req.path);
    HttpResponse r{204, "text/plain", {}, ""};
    if (cors_origin_.empty()) return r;  // an origin not allowed: no CORS headers, the browser refuses
    const std::string asked = req.header("Access-Control-Request-Headers");
    r.headers = {{"Access-Control-Allow-Methods", methods + ", OPTIONS"},
                 {"Access-Control-Allow-Headers",
                  asked.empty() ? "Authorization, Content-Type, x-api-key, anthropic-version" : asked},
                 {"Access-Control-Max-Age", "86400"}};
    return r;
  }

  HttpReply call(const Route& route, const HttpRequest& req) {
    try {
      return route.handler(req);
    } catch (const std::exception& e) {
      return srv_.error(&req, 500, e.what());
    } catch (...) {
      return srv_.error(&req, 500, "internal error");
    }
  }

  void deliver(HttpReply reply) {
    if (closed_) {
      if (auto* r = std::get_if<std::shared_ptr<HttpResponder>>(&reply)) (*r)->cancel("");
      return;
    }
    if (auto* whole = std::get_if<HttpResponse>(&reply)) return send_whole(std::move(*whole));
    responder_ = std::get<std::shared_ptr<HttpResponder>>(std::move(reply));
    finished_ = head_sent_ = streamed_ = false;
    // Nothing else may be pending while the answer waits for its engine (the hang-up watch ends
    // once the client sends more): the connection holds itself until the answer is done.
    self_hold_ = shared_from_this();
    watch_for_hangup();
    std::weak_ptr<HttpConnection> weak = weak_from_this();
    try {
      responder_->start([weak, gate = srv_.wake_gate] {
        std::lock_guard<std::mutex> lock(gate->mu);
        if (!gate->open) return;
        if (auto self = weak.lock()) {
          // The only reference goes with the handler: the connection is never destroyed on the
          // waking thread.
          auto ex = self->stream_.get_executor();
          asio::post(ex, [self = std::move(self)] { self->on_wake(); });
        }
      });
    } catch (const std::exception& e) {
      return fail_answer(e.what());
    }
    if (srv_.draining) responder_->cancel("the server is shutting down");
  }

  // The client closing its side (or resetting) while it waits is seen as the socket turning
  // readable with nothing to read. Bytes it sends meanwhile (a pipelined request) stay in the
  // kernel until this answer is done.
  void watch_for_hangup() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_ || !self->responder_ || self->finished_) return;
      char c;
      const ssize_t n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->watch_for_hangup();
      ++self->srv_.n_disconnects;
      self->close();
    });
  }

  void on_wake() {
    if (closed_ || !responder_ || writing_ || finished_) return;
    HttpResponder::Output o;
    try {
      o = responder_->poll();
    } catch (const std::exception& e) {
      return fail_answer(e.what());
    }
    std::string bytes;
    if (o.head && !head_sent_) {
      head_sent_ = true;
      streamed_ = o.streamed;
      if (!streamed_) {
        finished_ = true;
        const std::string head = wire_head(*o.head, int64_t(o.head->body.size()), false, !keep_alive_, cors_origin_);
        return write(head + o.head->body, true);
      }
      if (http10_) keep_alive_ = false;  // no chunked coding in HTTP/1.0: the body ends when the connection does
      bytes = wire_head(*o.head, -1, !http10_, !keep_alive_, cors_origin_);
    }
    if (head_sent_ && streamed_ && !o.data.empty()) bytes += http10_ ? o.data : chunk(o.data);
    if (o.finished) {
      finished_ = true;
      if (!head_sent_) {  // a responder that ends without a head: an error, not a hang
        keep_alive_ = false;
        return send_whole(srv_.error(nullptr, 500, "the answer ended without a response"));
      }
      if (!http10_) bytes += "0\r\n\r\n";
    }
    if (!bytes.empty()) write(std::move(bytes), finished_);
  }

  // A responder that throws ends its answer with a 500 if nothing of it is out yet, else by
  // closing; the connection is not reused (its framing may be broken).
  void fail_answer(const std::string& what) {
    responder_->cancel("");
    if (head_sent_) return close();
    keep_alive_ = false;
    finished_ = true;
    send_whole(srv_.error(nullptr, 500, what));
  }

  void send_whole(HttpResponse r) {
    finished_ = true;
    write(wire_head(r, int64_t(r.body.size()), false, !keep_alive_, cors_origin_) + r.body, true);
  }

  // An error before any of the answer is out, then the connection is closed.
  void fail(int status, const std::string& message) {
    reading_ = false;
    keep_alive_ = false;
    send_whole(srv_.error(nullptr, status, message));
  }

  void write(std::string bytes, bool last) {
    writing_ = true;
    out_ = std::move(bytes);
    stream_.expires_after(std::chrono::seconds(srv_.opt.write_timeout_s));
    asio::async_write(stream_, asio::buffer(out_), [self = shared_from_this(), last](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->stream_.expires_never();
      if (ec) {
        if (self->responder_ && !self->finished_) ++self->srv_.n_disconnects;
        return self->close();
      }
      if (!last) return self->on_wake();  // more may have come while this was written
      if (self->responder_) {
        self->responder_.reset();
        self->self_hold_.reset();  // `self` keeps it alive to the end of this handler
        beast::error_code ignored;
        self->stream_.socket().cancel(ignored);  // the hang-up watch
      }
      if (!self->keep_alive_) return self->close();
      self->read_request();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    reading_ = false;
    if (responder_ && !finished_) responder_->cancel("");
    responder_.reset();
    self_hold_.reset();  // callers hold their own reference
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  HttpServer::Impl& srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<HttpResponder> responder_;
  std::shared_ptr<HttpConnection> self_hold_;
  std::string out_;
  Clock::time_point arrived_{};
  std::atomic<bool> reading_{false};
  std::atomic<Clock::rep> reading_since_{0};
  std::string cors_origin_;  // Access-Control-Allow-Origin for the request in progress, or ""
  bool keep_alive_ = true, http10_ = false, closed_ = false, writing_ = false;
  bool finished_ = false, head_sent_ = false, streamed_ = false;
};

void HttpServer::Impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [self = this](beast::error_code ec, tcp::socket socket) {
    if (!self->acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors and the like: try again shortly rather than spin.
      auto t = std::make_shared<asio::steady_timer>(self->ioc, std::chrono::milliseconds(50));
      t->async_wait([self, t](beast::error_code) { self->accept(); });
      return;
    }
    ++self->n_connections;
    if (self->open_count() >= self->opt.max_connections && !self->evict_one()) self->refuse(std::move(socket));
    else std::make_shared<HttpConnection>(std::move(socket), *self)->start();
    self->accept();
  });
}

// At the connection limit with nobody to evict: a 503 written without waiting (it fits in a fresh
// socket's send buffer), then the socket is closed.
void HttpServer::Impl::refuse(tcp::socket socket) {
  ++n_refused;
  HttpResponse r = error(nullptr, 503, "too many connections (" + std::to_string(opt.max_connections) + "); try again later");
  r.headers.emplace_back("Retry-After", "1");
  const std::string bytes = wire_head(r, int64_t(r.body.size()), false, true, "") + r.body;
  beast::error_code ec;
  socket.non_blocking(true, ec);
  socket.write_some(asio::buffer(bytes), ec);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

// Closes the connection that has waited longest for its request (idle keep-alive or slow sender).
bool HttpServer::Impl::evict_one() {
  std::shared_ptr<HttpConnection> oldest;
  for (auto& c : connections())
    if (c->reading() && (!oldest || c->reading_since() < oldest->reading_since())) oldest = c;
  if (!oldest) return false;
  ++n_evicted;
  oldest->close_if_reading();
  return true;
}

void HttpServer::Impl::drain_tick() {
  if (open_count() == 0) return ioc.stop();
  const auto now = Clock::now();
  if (!drain_cancelled && now >= drain_deadline) {
    drain_cancelled = true;
    for (auto& c : connections()) c->cancel_answer("the server is shutting down");
  }
  // Answers told to stop have a few seconds to say so; then the server stops regardless.
  if (now >= drain_deadline + std::chrono::seconds(5)) return ioc.stop();
  drain_timer.expires_after(std::chrono::milliseconds(50));
  drain_timer.async_wait([self = this](beast::error_code ec) {
    if (!ec) self->drain_tick();
  });
}

HttpServer::HttpServer(HttpServerOptions opt, ErrorMaker errors) : impl_(std::make_unique<Impl>(std::move(opt), std::move(errors))) {}

HttpServer::~HttpServer() {
  stop();
  impl_->workers.stop();
  impl_->workers.join();
  {
    std::lock_guard<std::mutex> lock(impl_->wake_gate->mu);
    impl_->wake_gate->open = false;
  }
  beast::error_code ec;
  impl_->acceptor.close(ec);
  // run() has returned (its caller joined it): no handler runs. Connections with an answer in
  // progress hold themselves; they let go here and the rest go with the I/O context's handlers.
  for (auto& c : impl_->connections()) c->abandon();
}

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler handler, bool blocking) {
  impl_->routes.push_back({method, path, std::move(handler), blocking});
}

void HttpServer::route_prefix(const std::string& method, const std::string& prefix, HttpHandler handler, bool blocking) {
  impl_->routes.push_back({method, prefix, std::move(handler), blocking, /*prefix=*/true});
}

void HttpServer::set_gate(Gate gate) { impl_->gate = std::move(gate); }

bool HttpServer::bind(std::string& error, std::optional<int> port_override) {
  Impl& s = *impl_;
  if (port_override) s.opt.port = *port_override;
  beast::error_code ec;
  const auto address = asio::ip::make_address(s.opt.host, ec);
  std::vector<tcp::endpoint> endpoints;
  if (!ec) {
    endpoints.emplace_back(address, std::uint16_t(s.opt.port));
  } else {
    tcp::resolver resolver(s.ioc);
    auto results = resolver.resolve(s.opt.host, std::to_string(s.opt.port), tcp::resolver::passive, ec);
    if (ec) {
      error = "cannot resolve the address \"" + s.opt.host + "\": " + ec.message();
      return false;
    }
    for (const auto& r : results) endpoints.push_back(r.endpoint());
  }
  for (const tcp::endpoint& ep : endpoints) {
    beast::error_code e;
    s.acceptor.open(ep.protocol(), e);
    // SO_REUSEADDR only (a restart does not wait out TIME_WAIT); never SO_REUSEPORT, which would
    // let a second server share the port silently instead of failing with "address in use".
    if (!e) s.acceptor.set_option(asio::socket_base::reuse_address(true), e);
    if (!e) s.acceptor.bind(ep, e);
    if (!e) s.acceptor.listen(asio::socket_base::max_listen_connections, e);
    if (!e) return true;
    beast::error_code ignored;
    s.acceptor.close(ignored);
    ec = e;
  }
  error = "cannot listen on " + s.opt.host + ":" + std::to_string(s.opt.port) + " (" +
          (ec == asio::error::address_in_use ? std::string("address in use") : ec.message()) + ")";
  return false;
}

int HttpServer::port() const {
  beast::error_code ec;
  const auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? -1 : int(ep.port());
}

void HttpServer::run() {
  Impl& s = *impl_;
  if (s.ioc.stopped()) return;  // stop() came first
  s.accept();
  std::vector<std::thread> extra;
  for (int i = 1; i < std::max(1, s.opt.io_threads); ++i) extra.emplace_back([&s] { run_io(s.ioc); });
  run_io(s.ioc);
  for (auto& t : extra) t.join();
}

void HttpServer::drain(std::chrono::milliseconds grace) {
  asio::post(impl_->ioc, [self = impl_.get(), grace] {
    if (self->draining.exchange(true)) return;
    beast::error_code ec;
    self->acceptor.close(ec);
    self->drain_deadline = Clock::now() + grace;
    for (auto& c : self->connections()) c->on_drain();
    self->drain_tick();
  });
}

void HttpServer::stop() { impl_->ioc.stop(); }

bool HttpServer::draining() const { return impl_->draining; }

HttpServerStats HttpServer::stats() const {
  const Impl& s = *impl_;
  HttpServerStats st;
  st.connections = s.n_connections;
  st.refused_connections = s.n_refused;
  st.evicted_connections = s.n_evicted;
  st.protocol_errors = s.n_protocol;
  st.timeouts = s.n_timeouts;
  st.disconnects = s.n_disconnects;
  st.open_connections = impl_->open_count();
  return st;
}

}  // namespace ds41
