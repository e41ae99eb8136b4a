// A small blocking HTTP/1.1 client for the server tests (Boost.Beast, one connection per
// request): status, headers and body, or the bytes as they arrive to a receiver that may hang up.
#pragma once

#include <chrono>
#include <functional>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace ds41::test {

struct HttpResult {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string error;  // non-empty: no response
  explicit operator bool() const { return error.empty(); }
  const HttpResult* operator->() const { return this; }
  std::string get_header_value(const std::string& name) const {
    for (const auto& [k, v] : headers)
      if (boost::beast::iequals(k, name)) return v;
    return {};
  }
};

class HttpTestClient {
 public:
  explicit HttpTestClient(int port, std::string bearer = {}) : port_(port), bearer_(std::move(bearer)) {}

  HttpResult Get(const std::string& path) const { return send("GET", path, {}, {}); }
  HttpResult Post(const std::string& path, const std::string& body, const std::string& content_type = "application/json") const {
    return send("POST", path, body, content_type);
  }

  // Sends the request, waits `ms` milliseconds reading nothing, and closes the connection.
  void send_and_hang_up(const std::string& path, const std::string& body, int ms) const {
    namespace http = boost::beast::http;
    using tcp = boost::asio::ip::tcp;
    boost::asio::io_context ioc;
    tcp::socket socket(ioc);
    socket.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)));
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, "127.0.0.1");
    if (!bearer_.empty()) req.set(http::field::authorization, "Bearer " + bearer_);
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(socket, req);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    socket.close();
  }

  // `receiver` (optional) sees the raw response bytes as they arrive; returning false hangs up.
  HttpResult send(const std::string& method, const std::string& path, const std::string& body, const std::string& content_type,
                  const std::function<bool(const std::string&)>& receiver = {}) const {
    namespace beast = boost::beast;
    namespace http = beast::http;
    using tcp = boost::asio::ip::tcp;
    HttpResult out;
    try {
      boost::asio::io_context ioc;
      tcp::socket socket(ioc);
      socket.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)));
      http::request<http::string_body> req{http::string_to_verb(method), path, 11};
      req.set(http::field::host, "127.0.0.1");
      if (!bearer_.empty()) req.set(http::field::authorization, "Bearer " + bearer_);
      if (!content_type.empty()) req.set(http::field::content_type, content_type);
      req.body() = body;
      if (method == "POST" || !body.empty()) req.prepare_payload();
      http::write(socket, req);
      if (receiver) {
        char buf[4096];
        for (;;) {
          beast::error_code ec;
          const size_t n = socket.read_some(boost::asio::buffer(buf), ec);
          if (ec) break;
          if (!receiver(std::string(buf, n))) break;
        }
        socket.close();
        out.error = "hung up";
        return out;
      }
      beast::flat_buffer buffer;
      http::response_parser<http::string_body> parser;
      parser.body_limit(boost::none);
      http::read(socket, buffer, parser);
      const auto& res = parser.get();
      out.status = int(res.result_int());
      for (const auto& f : res) out.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
      out.body = res.body();
    } catch (const std::exception& e) {
      out.error = e.what();
    }
    return out;
  }

 private:
  int port_;
  std::string bearer_;
};

}  // namespace ds41::test
