#include "io/direct_reader.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "base/error.h"

namespace ds41 {

DirectReader::DirectReader(int threads) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { worker(); });
}

DirectReader::~DirectReader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_) t.join();
  for (File& f : files_) {
    if (f.direct_fd >= 0) ::close(f.direct_fd);
    if (f.buffered_fd >= 0) ::close(f.buffered_fd);
  }
}

int DirectReader::open(const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < files_.size(); ++i)
    if (files_[i].path == path) return int(i);
  File f;
  f.path = path;
  f.buffered_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.buffered_fd < 0) throw Error(path + ": cannot open for reading: " + std::strerror(errno));
  f.direct_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  f.use_direct = f.direct_fd >= 0;
  files_.push_back(std::move(f));
  return int(files_.size() - 1);
}

bool DirectReader::direct(int file) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return files_.at(size_t(file)).use_direct;
}

void DirectReader::submit(int file, uint64_t offset, uint64_t length, uint8_t* dest,
                          std::function<void(const std::string* error)> done) {
  if (offset % kAlign || length % kAlign || reinterpret_cast<uintptr_t>(dest) % kAlign)
    throw Error("DirectReader: unaligned read request (internal error)");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (file < 0 || size_t(file) >= files_.size()) throw Error("DirectReader: unknown file (internal error)");
    queue_.push_back(Request{file, offset, length, dest, std::move(done)});
  }
  ready_.notify_one();
}

void DirectReader::worker() {
  for (;;) {
    Request r;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      r = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string error;
    try {
      error = read(r);
    } catch (const std::exception& e) {
      error = e.what();
    }
    r.done(error.empty() ? nullptr : &error);
  }
}

std::string DirectReader::read(Request& r) {
  int fd;
  bool direct;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const File& f = files_[size_t(r.file)];
    direct = f.use_direct;
    fd = direct ? f.direct_fd : f.buffered_fd;
    path = f.path;
  }
  uint64_t done = 0;
  while (done < r.length) {
    const ssize_t n = ::pread(fd, r.dest + done, size_t(r.length - done), off_t(r.offset + done));
    if (n > 0) {
      done += uint64_t(n);
      if (direct && done % kAlign) break;  // a short direct read ends at the end of the file
      continue;
    }
    if (n == 0) break;  // end of file: the rest of the range lies past it
    if (errno == EINTR) continue;
    if (direct && errno == EINVAL) {
      // The file system refused this direct read after all: this file is read buffered from now.
      std::lock_guard<std::mutex> lock(mutex_);
      files_[size_t(r.file)].use_direct = false;
      fd = files_[size_t(r.file)].buffered_fd;
      direct = false;
      continue;
    }
    return path + ": read of " + std::to_string(r.length) + " bytes at offset " + std::to_string(r.offset) +
           " failed: " + std::strerror(errno);
  }
  // A buffered read leaves the range in the page cache: drop it, the caller keeps its own copy.
  if (!direct) ::posix_fadvise(fd, off_t(r.offset), off_t(r.length), POSIX_FADV_DONTNEED);
  return "";
}

}  // namespace ds41
