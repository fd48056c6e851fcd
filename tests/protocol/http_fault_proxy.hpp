// tests/protocol/http_fault_proxy.hpp: a misbehaving HTTP/1.1 proxy on 127.0.0.1 for the S3
// tests. It forwards each request, bytes unchanged (so SigV4 signatures stay valid; only
// "Connection: close" is added, which is not signed), to an upstream server and hands the answer
// back, except that the answers to requests matching a pattern take the next fault of a script:
// trickled at 2 bytes/s, a Content-Length that lies, a body cut short or with a byte flipped, a
// 500 without asking upstream, or a Content-Length of 1 TiB. One request per connection (the
// answer says Connection: close). Every wait is bounded (no fault lasts more than
// `fault_limit`, sockets time out after 15 s), and the destructor ends every connection.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dcr_test {

class fault_proxy {
 public:
  enum class fault {
    pass,        ///< forwarded as it came
    trickle,     ///< the head at once, the body at 2 bytes/s (until fault_limit, then closed)
    lie_length,  ///< Content-Length 1000 more than the body, which is sent whole, then closed
    truncate,    ///< the honest Content-Length, half the body, then closed
    corrupt,     ///< one byte of the body flipped (same length)
    status500,   ///< 500 InternalError, upstream not asked
    huge_length, ///< Content-Length 1 TiB, 16 bytes of body, then closed after fault_limit
  };

  /// A proxy to upstream 127.0.0.1:`upstream_port`; requests whose first line contains `match`
  /// take the faults of `script` in order, then pass.
  fault_proxy(int upstream_port, std::string match, std::vector<fault> script,
              std::chrono::milliseconds fault_limit = std::chrono::milliseconds(8000))
      : upstream_(upstream_port), match_(std::move(match)), script_(script.begin(), script.end()),
        limit_(fault_limit) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error("fault_proxy: socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || ::listen(fd_, 64) != 0)
      throw std::runtime_error("fault_proxy: bind/listen");
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  fault_proxy(const fault_proxy&) = delete;
  fault_proxy& operator=(const fault_proxy&) = delete;
  ~fault_proxy() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    acceptor_.join();
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      threads.swap(connections_);
    }
    for (auto& t : threads) t.join();
  }

  [[nodiscard]] std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  /// Requests that matched the pattern.
  [[nodiscard]] int matched() const { return matched_.load(); }
  /// Every request's head (request line and headers), in arrival order.
  [[nodiscard]] std::vector<std::string> heads() const {
    std::lock_guard lock(mutex_);
    return heads_;
  }

 private:
  static bool send_all(int c, std::string_view data) {
    while (!data.empty()) {
      const auto n = ::send(c, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  static void set_timeouts(int c) {
    timeval tv{15, 0};
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }

  static std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    return s;
  }

  // The value of header `name` (lower case) in `head`, or npos-marked empty.
  static bool header_value(const std::string& head, const std::string& name, std::uint64_t& value) {
    const std::string l = lower(head);
    const auto at = l.find("\r\n" + name + ":");
    if (at == std::string::npos) return false;
    value = std::stoull(head.substr(at + name.size() + 3));
    return true;
  }

  void accept_loop() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::lock_guard lock(mutex_);
      connections_.emplace_back([this, c] {
        serve(c);
        ::close(c);
      });
    }
  }

  // Sleeps `d` unless the proxy stops.
  bool nap(std::chrono::milliseconds d) const {
    const auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
      if (stop_) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  void serve(int c) {
    set_timeouts(c);
    std::string req;
    char buf[65536];
    while (req.find("\r\n\r\n") == std::string::npos) {
      const auto n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) return;
      req.append(buf, static_cast<std::size_t>(n));
    }
    const auto head_end = req.find("\r\n\r\n");
    std::string head = req.substr(0, head_end);
    std::uint64_t length = 0;
    if (header_value(head, "content-length", length))
      while (req.size() < head_end + 4 + length) {
        const auto n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) return;
        req.append(buf, static_cast<std::size_t>(n));
      }
    const std::string line = head.substr(0, head.find("\r\n"));
    fault f = fault::pass;
    {
      std::lock_guard lock(mutex_);
      heads_.push_back(head);
      if (line.find(match_) != std::string::npos) {
        ++matched_;
        if (!script_.empty()) {
          f = script_.front();
          script_.pop_front();
        }
      }
    }
    if (f == fault::status500) {
      const std::string body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InternalError</Code>"
                               "<Message>fault_proxy</Message></Error>";
      send_all(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
      return;
    }
    // Forward, asking upstream to close after its answer, and read that answer to its end.
    const std::string forwarded = head + "\r\nConnection: close\r\n\r\n" + req.substr(head_end + 4);
    const int u = ::socket(AF_INET, SOCK_STREAM, 0);
    if (u < 0) return;
    set_timeouts(u);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(upstream_));
    std::string answer;
    if (::connect(u, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && send_all(u, forwarded)) {
      for (;;) {
        const auto n = ::recv(u, buf, sizeof buf, 0);
        if (n <= 0) break;
        answer.append(buf, static_cast<std::size_t>(n));
      }
    }
    ::close(u);
    const auto answer_head_end = answer.find("\r\n\r\n");
    if (answer_head_end == std::string::npos) return;
    std::string rhead = answer.substr(0, answer_head_end);
    std::string body = answer.substr(answer_head_end + 4);
    std::uint64_t declared = 0;
    const bool sized = header_value(rhead, "content-length", declared);
    if (!sized || f == fault::pass || line.starts_with("HEAD ")) {
      send_all(c, answer);
      return;
    }
    // Rewrite the head: our Content-Length, Connection: close.
    std::string kept;
    for (std::size_t at = 0; at < rhead.size();) {
      auto end = rhead.find("\r\n", at);
      if (end == std::string::npos) end = rhead.size();
      const std::string h = rhead.substr(at, end - at);
      const std::string l = lower(h);
      if (!l.starts_with("content-length:") && !l.starts_with("connection:")) kept += h + "\r\n";
      at = end + 2;
    }
    auto head_with = [&](std::uint64_t n) {
      return kept + "Content-Length: " + std::to_string(n) + "\r\nConnection: close\r\n\r\n";
    };
    const auto t0 = std::chrono::steady_clock::now();
    switch (f) {
      case fault::trickle:
        if (!send_all(c, head_with(body.size()))) return;
        for (std::size_t i = 0; i < body.size(); i += 1) {
          if (std::chrono::steady_clock::now() - t0 > limit_) return;  // bounded: close
          if (!send_all(c, body.substr(i, 1)) || !nap(std::chrono::milliseconds(500))) return;
        }
        return;
      case fault::lie_length:
        send_all(c, head_with(body.size() + 1000) + body);
        return;
      case fault::truncate:
        send_all(c, head_with(body.size()) + body.substr(0, body.size() / 2));
        return;
      case fault::corrupt:
        if (!body.empty()) body[body.size() / 2] = static_cast<char>(body[body.size() / 2] ^ 0x40);
        send_all(c, head_with(body.size()) + body);
        return;
      case fault::huge_length:
        if (!send_all(c, head_with(std::uint64_t{1} << 40) + body.substr(0, 16))) return;
        // Hold the connection (a client without a cap would wait for the terabyte).
        while (std::chrono::steady_clock::now() - t0 < limit_) {
          pollfd p{c, POLLIN, 0};
          if (::poll(&p, 1, 50) > 0) {
            char b;
            if (::recv(c, &b, 1, MSG_DONTWAIT) <= 0) return;  // the client hung up
          }
          if (stop_) return;
        }
        return;
      default:
        send_all(c, answer);
        return;
    }
  }

  int upstream_;
  std::string match_;
  std::deque<fault> script_;
  std::chrono::milliseconds limit_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> matched_{0};
  mutable std::mutex mutex_;
  std::vector<std::string> heads_;
  std::vector<std::thread> connections_;
  std::thread acceptor_;
};

}  // namespace dcr_test
