// Reads byte ranges of files into caller memory on a pool of I/O threads, past the page cache.
//
// What streams a model larger than RAM from disk (model/expert_cache.h): each request is one
// pread of an aligned range, many in flight at once (an SSD reaches its speed only with a deep
// queue). Files are opened with O_DIRECT where the file system allows it, so a read costs no
// page-cache memory beside the caller's buffer; where it does not (tmpfs, some network file
// systems), the read is buffered and the range is dropped from the page cache right after
// (POSIX_FADV_DONTNEED), which keeps the same budget in the steady state.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ds41 {

class DirectReader {
 public:
  // O_DIRECT needs offsets, lengths and buffers aligned to the device's logical block size;
  // 4 KiB covers every current device.
  static constexpr uint64_t kAlign = 4096;

  explicit DirectReader(int threads);
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  // Opens `path` once (later calls return the same index); throws Error when it cannot be opened.
  int open(const std::string& path);
  // Reads bytes [offset, offset + length) of file `file` into `dest`; offset, length and dest
  // must be multiples of kAlign. Bytes past the end of the file are left as they were. `done`
  // runs on an I/O thread: with nullptr on success, else the error in words.
  void submit(int file, uint64_t offset, uint64_t length, uint8_t* dest,
              std::function<void(const std::string* error)> done);
  // Whether reads of `file` bypass the page cache (O_DIRECT was accepted).
  bool direct(int file) const;

 private:
  struct File {
    std::string path;
    int direct_fd = -1;    // O_DIRECT, or -1
    int buffered_fd = -1;  // always open: the fallback
    bool use_direct = false;
  };
  struct Request {
    int file;
    uint64_t offset, length;
    uint8_t* dest;
    std::function<void(const std::string*)> done;
  };
  void worker();
  std::string read(Request& r);  // "" on success

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Request> queue_;
  std::vector<File> files_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

}  // namespace ds41
