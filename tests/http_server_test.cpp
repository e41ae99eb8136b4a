// The HTTP layer alone (server/http_server.h) over loopback sockets, with handlers that stand in
// for the engine: framing and smuggling attempts, oversized heads, slow senders, pipelining,
// hang-ups during an answer, and drain. Fast, so it also runs under the sanitizers.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <mutex>
#include <netinet/in.h>
#include <regex>
#include <stdexcept>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include "server/http_server.h"

namespace ds41 {
namespace {

using namespace std::chrono_literals;

// (An obsolete line folding is unfolded into a space, as RFC 9112 allows: a folded
// "Transfer-Encoding" line becomes part of the previous header's value, never framing.)

// An answer made by a thread of its own: `n` pieces 5 ms apart, streamed or whole.
struct TickingResponder : HttpResponder {
  TickingResponder(int n, bool stream) : n_(n), stream_(stream) {}
  ~TickingResponder() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void start(std::function<void()> wake) override {
    thread_ = std::thread([this, wake] {
      for (int i = 0; i < n_ && !stop_; ++i) {
        std::this_thread::sleep_for(5ms);
        {
          std::lock_guard<std::mutex> lock(mu_);
          ready_ += "piece " + std::to_string(i) + "\n";
          if (i + 1 == n_) done_ = true;
        }
        wake();
      }
    });
  }
  Output poll() override {
    std::lock_guard<std::mutex> lock(mu_);
    Output o;
    if (!reason_.empty()) {
      done_ = true;
      ready_ += "stopped: " + reason_ + "\n";
    }
    if (stream_) {
      if (!head_) o.head = HttpResponse{200, "text/plain", {}, {}}, o.streamed = true, head_ = true;
      o.data = std::move(ready_);
      ready_.clear();
    } else if (done_) {
      o.head = HttpResponse{200, "text/plain", {}, ready_};
    }
    o.finished = done_;
    return o;
  }
  void cancel(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++cancels;
    stop_ = true;
    if (!reason.empty()) reason_ = reason;
  }
  std::atomic<int> cancels{0};

 private:
  int n_;
  bool stream_;
  std::mutex mu_;
  std::string ready_, reason_;
  bool done_ = false, head_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void start(HttpServerOptions opt = {}, HttpServer::Gate gate = {}) {
    opt.host = "127.0.0.1";
    opt.port = 0;
    server_ = std::make_unique<HttpServer>(opt, [this](const HttpRequest*, int status, const std::string& msg) {
      if (throwing_errors_) throw std::runtime_error("the error maker failed");
      return HttpResponse{status, "text/plain", {}, msg};
    });
    server_->route("GET", "/ping", [](const HttpRequest&) -> HttpReply { return HttpResponse{200, "text/plain", {}, "pong"}; });
    server_->route("POST", "/echo", [](const HttpRequest& r) -> HttpReply { return HttpResponse{200, "text/plain", {}, r.body}; }, true);
    server_->route("GET", "/items/special", [](const HttpRequest&) -> HttpReply { return HttpResponse{200, "text/plain", {}, "exact"}; });
    server_->route_prefix("GET", "/items/", [](const HttpRequest& r) -> HttpReply {
      return HttpResponse{200, "text/plain", {}, "item " + r.path.substr(7)};
    });
    server_->route("POST", "/stream", [this](const HttpRequest& r) -> HttpReply {
      auto t = std::make_shared<TickingResponder>(std::stoi(r.body), true);
      last_ = t;
      return std::shared_ptr<HttpResponder>(t);
    }, true);
    server_->route("POST", "/whole", [this](const HttpRequest& r) -> HttpReply {
      auto t = std::make_shared<TickingResponder>(std::stoi(r.body), false);
      last_ = t;
      return std::shared_ptr<HttpResponder>(t);
    }, true);
    server_->route("POST", "/broken", [](const HttpRequest&) -> HttpReply {
      struct Broken : HttpResponder {
        void start(std::function<void()>) override { throw std::runtime_error("cannot start"); }
        Output poll() override { return {}; }
        void cancel(const std::string&) override {}
      };
      return std::shared_ptr<HttpResponder>(std::make_shared<Broken>());
    }, true);
    if (gate) server_->set_gate(std::move(gate));
    std::string error;
    ASSERT_TRUE(server_->bind(error)) << error;
    port_ = server_->port();
    thread_ = std::thread([this] { server_->run(); });
  }
  void TearDown() override {
    if (!server_) return;
    server_->stop();
    thread_.join();
    server_.reset();
  }

  int connect_socket() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }
  static bool send_all(int fd, const std::string& s) {
    size_t at = 0;
    while (at < s.size()) {
      const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += size_t(n);
    }
    return true;
  }
  // Everything until the server closes (or 5 s pass); `closed` says which.
  static std::string read_all(int fd, bool* closed = nullptr) {
    std::string out;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        out.append(buf, size_t(n));
        continue;
      }
      if (closed) *closed = n == 0 || errno == ECONNRESET;
      return out;
    }
  }
  static std::vector<int> statuses(const std::string& wire) {
    std::vector<int> out;
    static const std::regex status(R"(HTTP/1\.1 (\d{3}) )");
    for (auto it = std::sregex_iterator(wire.begin(), wire.end(), status); it != std::sregex_iterator(); ++it)
      out.push_back(std::stoi((*it)[1]));
    return out;
  }
  std::string exchange(const std::string& request, bool* closed = nullptr) {
    const int fd = connect_socket();
    send_all(fd, request);
    std::string out = read_all(fd, closed);
    ::close(fd);
    return out;
  }

  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
  std::shared_ptr<TickingResponder> last_;
  std::atomic<bool> throwing_errors_{false};
};

TEST_F(HttpServerTest, AnswersRoutesAndSaysWhatIsWrongWithOthers) {
  start();
  bool closed = false;
  const std::string r = exchange("GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &closed);
  EXPECT_EQ(statuses(r), std::vector<int>{200});
  EXPECT_NE(r.find("\r\n\r\npong"), std::string::npos);
  EXPECT_TRUE(closed);
  const std::string wrong = exchange("DELETE /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(statuses(wrong), std::vector<int>{405});
  EXPECT_NE(wrong.find("Allow: GET"), std::string::npos);
  EXPECT_EQ(statuses(exchange("GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), std::vector<int>{404});
  // A body read with Content-Length and chunked, and Expect: 100-continue honoured.
  EXPECT_NE(exchange("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello").find("\r\n\r\nhello"),
            std::string::npos);
  EXPECT_NE(exchange("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
                .find("\r\n\r\nabcde"),
            std::string::npos);
  const std::string cont = exchange("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\nConnection: close\r\n\r\nok");
  EXPECT_EQ(statuses(cont), (std::vector<int>{100, 200}));
}

TEST_F(HttpServerTest, PrefixRoutesTakeWhatNoExactRouteMatches) {
  start();
  const auto body = [](const std::string& wire) { return wire.substr(wire.find("\r\n\r\n") + 4); };
  EXPECT_EQ(body(exchange("GET /items/special HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), "exact");
  EXPECT_EQ(body(exchange("GET /items/42 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), "item 42");
  EXPECT_EQ(statuses(exchange("GET /items/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), std::vector<int>{404});
  const std::string wrong = exchange("POST /items/42 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(statuses(wrong), std::vector<int>{405});
  EXPECT_NE(wrong.find("Allow: GET"), std::string::npos);
}

// CORS is off unless origins are given: then a preflight (OPTIONS, before any gate) gets 204 with
// the path's methods, and every answer to an allowed origin carries Access-Control-Allow-Origin,
// streamed ones included; an origin not allowed gets no CORS header.
TEST_F(HttpServerTest, CorsOnlyWhenOriginsAreGiven) {
  start();
  const std::string off = exchange("OPTIONS /echo HTTP/1.1\r\nHost: x\r\nOrigin: http://a.test\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(statuses(off), std::vector<int>{405});
  EXPECT_EQ(off.find("Access-Control"), std::string::npos);
  TearDown();
  HttpServerOptions opt;
  opt.cors_origins = {"http://a.test", "http://b.test:8000"};
  start(opt, [](const HttpRequest& r) -> std::optional<HttpResponse> {
    if (r.path == "/ping") return HttpResponse{401, "text/plain", {}, "key"};
    return std::nullopt;
  });
  const std::string pre = exchange(
      "OPTIONS /echo HTTP/1.1\r\nHost: x\r\nOrigin: http://b.test:8000\r\nAccess-Control-Request-Method: POST\r\n"
      "Access-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(statuses(pre), std::vector<int>{204});
  EXPECT_NE(pre.find("Access-Control-Allow-Origin: http://b.test:8000\r\n"), std::string::npos);
  EXPECT_NE(pre.find("Access-Control-Allow-Methods: POST, OPTIONS\r\n"), std::string::npos);
  EXPECT_NE(pre.find("Access-Control-Allow-Headers: authorization, content-type\r\n"), std::string::npos);
  EXPECT_NE(pre.find("Vary: Origin"), std::string::npos);
  const std::string stranger = exchange("OPTIONS /echo HTTP/1.1\r\nHost: x\r\nOrigin: http://c.test\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(statuses(stranger), std::vector<int>{204});
  EXPECT_EQ(stranger.find("Access-Control"), std::string::npos);
  EXPECT_EQ(statuses(exchange("OPTIONS /none HTTP/1.1\r\nHost: x\r\nOrigin: http://a.test\r\nConnection: close\r\n\r\n")),
            std::vector<int>{404});
  // The gate's answer (an error) carries the header too, so the page can read why.
  const std::string denied = exchange("GET /ping HTTP/1.1\r\nHost: x\r\nOrigin: http://a.test\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(statuses(denied), std::vector<int>{401});
  EXPECT_NE(denied.find("Access-Control-Allow-Origin: http://a.test\r\n"), std::string::npos);
  const std::string streamed = exchange(
      "POST /stream HTTP/1.1\r\nHost: x\r\nOrigin: http://a.test\r\nContent-Length: 1\r\nConnection: close\r\n\r\n2");
  EXPECT_EQ(statuses(streamed), std::vector<int>{200});
  EXPECT_NE(streamed.find("Access-Control-Allow-Origin: http://a.test\r\n"), std::string::npos);
  EXPECT_NE(streamed.find("piece 1"), std::string::npos);
  TearDown();
  opt.cors_origins = {"*"};
  start(opt);
  const std::string any = exchange("GET /ping HTTP/1.1\r\nHost: x\r\nOrigin: http://z.test\r\nConnection: close\r\n\r\n");
  EXPECT_NE(any.find("Access-Control-Allow-Origin: *\r\n"), std::string::npos);
  EXPECT_EQ(any.find("Vary: Origin"), std::string::npos);
}

// What a handler, a responder or the error maker throws ends that answer (500, or the error as
// plain text), never the server; bytes that are not UTF-8 in the request line reach the error
// maker as they are.
TEST_F(HttpServerTest, ThrowingCallbacksEndTheirAnswerNotTheServer) {
  start();
  const std::string broken = exchange("POST /broken HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(statuses(broken), std::vector<int>{500});
  EXPECT_NE(broken.find("cannot start"), std::string::npos) << broken;
  EXPECT_EQ(statuses(exchange("GET /\xff\xfe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), std::vector<int>{404});
  throwing_errors_ = true;
  const std::string fallback = exchange("GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(statuses(fallback), std::vector<int>{404});
  EXPECT_NE(fallback.find("no such endpoint"), std::string::npos) << fallback;
  throwing_errors_ = false;
  EXPECT_EQ(statuses(exchange("GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), std::vector<int>{200});
}

TEST_F(HttpServerTest, AmbiguousFramingIsRefusedAndTheConnectionClosed) {
  start();
  const std::string smuggled = "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string chunked_body = "0\r\n\r\n" + smuggled;
  const std::vector<std::string> attacks = {
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(chunked_body.size()) +
          "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_body,
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: " + std::to_string(chunked_body.size()) +
          "\r\n\r\n" + chunked_body,
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 30\r\n\r\nok" + smuggled,
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n" + chunked_body,
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n" + smuggled,
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked_body,
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + smuggled,
      "GET http://elsewhere/ping HTTP/1.1\r\nHost: x\r\n\r\n" + smuggled,
      "GET /ping HTTP/2.0\r\nHost: x\r\n\r\n" + smuggled,
  };
  for (const std::string& a : attacks) {
    bool closed = false;
    const std::string r = exchange(a, &closed);
    const std::vector<int> st = statuses(r);
    ASSERT_EQ(st.size(), 1u) << a << "\n->\n" << r;  // one answer: the smuggled request never ran
    EXPECT_TRUE(st[0] == 400 || st[0] == 505) << a << "\n->\n" << r;
    EXPECT_TRUE(closed) << a;
  }
  EXPECT_EQ(server_->stats().protocol_errors, int64_t(attacks.size()));
}

TEST_F(HttpServerTest, OversizedHeadsAreRefusedAfterAFewKilobytes) {
  HttpServerOptions o;
  o.header_limit = 8 << 10;
  o.max_header_fields = 20;
  start(o);
  // Lines without end: 431 after the limit, the connection closed, the rest never read.
  const int fd = connect_socket();
  send_all(fd, "GET /ping HTTP/1.1\r\nHost: x\r\n");
  size_t sent = 0;
  const std::string lines = [] {
    std::string s;
    for (int i = 0; i < 1000; ++i) s += "X-Flood: aaaaaaaaaaaaaaaa\r\n";
    return s;
  }();
  while (sent < (size_t(64) << 20) && send_all(fd, lines)) sent += lines.size();
  bool closed = false;
  const std::string r = read_all(fd, &closed);
  ::close(fd);
  EXPECT_LT(sent, size_t(64) << 20);
  EXPECT_TRUE(r.empty() || statuses(r) == std::vector<int>{431}) << r.substr(0, 200);
  EXPECT_TRUE(closed);
  // Many short lines under the byte limit: the line count limit.
  std::string many = "GET /ping HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 30; ++i) many += "A" + std::to_string(i) + ": b\r\n";
  EXPECT_EQ(statuses(exchange(many + "\r\n")), std::vector<int>{431});
}

TEST_F(HttpServerTest, SlowSendersAreClosedAtTheRequestTimeoutWhileOthersAreServed) {
  HttpServerOptions o;
  o.request_timeout_s = 1;
  start(o);
  std::vector<int> slow;
  for (int i = 0; i < 32; ++i) {
    slow.push_back(connect_socket());
    send_all(slow.back(), "GET /ping HTTP/1.1\r\nHost: x\r\n");
  }
  // Meanwhile a normal request is answered at once.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(statuses(exchange("GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), std::vector<int>{200});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
  for (int fd : slow) {
    bool closed = false;
    read_all(fd, &closed);
    EXPECT_TRUE(closed);
    ::close(fd);
  }
  for (int i = 0; i < 100 && server_->stats().timeouts < 32; ++i) std::this_thread::sleep_for(10ms);  // counted just after closing
  EXPECT_EQ(server_->stats().timeouts, 32);
}

TEST_F(HttpServerTest, ConnectionLimitClosesTheLongestWaitingToMakeRoom) {
  HttpServerOptions o;
  o.max_connections = 4;
  start(o);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(connect_socket());
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(statuses(exchange("GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), std::vector<int>{200});
  EXPECT_GE(server_->stats().evicted_connections, 1);
  for (int fd : idle) ::close(fd);
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  start();
  const std::string r = exchange(
      "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n3"
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nlast"
      "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(statuses(r), (std::vector<int>{200, 200, 200, 200})) << r;
  const size_t pong = r.find("pong"), piece = r.find("piece 2"), last = r.find("last"), pong2 = r.rfind("pong");
  EXPECT_TRUE(pong < piece && piece < last && last < pong2 && pong2 != std::string::npos) << r;
}

TEST_F(HttpServerTest, AnswersAreStreamedChunkedOrSentWhole) {
  start();
  const std::string s = exchange("POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\n3");
  EXPECT_NE(s.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(s.find("piece 2\n\r\n0\r\n\r\n"), std::string::npos) << s;
  const std::string w = exchange("POST /whole HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\n3");
  EXPECT_NE(w.find("Content-Length: 24\r\n"), std::string::npos) << w;
  EXPECT_NE(w.find("piece 0\npiece 1\npiece 2\n"), std::string::npos) << w;
}

TEST_F(HttpServerTest, AClientThatHangsUpCancelsItsAnswerAtOnce) {
  start();
  for (const char* path : {"/stream", "/whole"}) {
    const int fd = connect_socket();
    send_all(fd, std::string("POST ") + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n10000");
    std::this_thread::sleep_for(100ms);
    const int64_t before = server_->stats().disconnects;
    ::close(fd);
    for (int i = 0; i < 100 && server_->stats().disconnects == before; ++i) std::this_thread::sleep_for(5ms);
    EXPECT_EQ(server_->stats().disconnects, before + 1) << path;
    ASSERT_TRUE(last_);
    EXPECT_GE(last_->cancels.load(), 1) << path;
  }
}

TEST_F(HttpServerTest, DrainLetsShortAnswersFinishAndStopsLongOnesWithAReason) {
  start();
  std::string short_answer, long_answer, late;
  std::thread s([&] { short_answer = exchange("POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n40"); });
  std::thread l([&] { long_answer = exchange("POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n99999"); });
  std::this_thread::sleep_for(100ms);
  const int idle = connect_socket();  // a keep-alive connection with nothing to say
  server_->drain(400ms);
  std::this_thread::sleep_for(50ms);
  bool idle_closed = false;
  read_all(idle, &idle_closed);
  ::close(idle);
  thread_.join();  // run() returns once the drain is over
  s.join();
  l.join();
  EXPECT_TRUE(idle_closed);
  EXPECT_NE(short_answer.find("piece 39\n"), std::string::npos);
  EXPECT_EQ(short_answer.find("stopped"), std::string::npos);
  EXPECT_NE(long_answer.find("stopped: the server is shutting down"), std::string::npos) << long_answer.substr(0, 300);
  EXPECT_NE(long_answer.find("0\r\n\r\n"), std::string::npos);  // the chunked body was ended properly
  thread_ = std::thread([] {});  // TearDown joins it
}

}  // namespace
}  // namespace ds41
