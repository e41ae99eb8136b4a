#include "dist/mpi_job.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/hash.h"
#include "base/thread_pool.h"
#include "model/model.h"

#ifdef DS41_HAVE_MPI
#include <mpi.h>
#endif

namespace ds41::dist {

namespace {

// Whether this process was started by an MPI launcher (OpenMPI's mpirun, or a PMI/PMIx one):
// only then is MPI initialised, so a plain `ds41 run` never touches it.
int launcher_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(name); v && *v) return std::max(1, std::atoi(v));
  return 1;
}

[[maybe_unused]] int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return 0;
}

}  // namespace

#ifndef DS41_HAVE_MPI

int start_job(int, char**) {
  if (launcher_size() <= 1) return -1;
  if (launcher_rank() == 0)
    std::fprintf(stderr, "error: this ds41 was built without MPI (OpenMPI's libopenmpi-dev was not found at build time): "
                         "it cannot run as %d ranks; rebuild with it installed, or run one process\n", launcher_size());
  return 2;
}
std::shared_ptr<ExpertParallel> expert_parallel() { return nullptr; }
int job_ranks() { return 1; }
void end_job() {}
void set_follower_threads(int) {}
std::vector<RankStats> job_stats() { return {}; }
void reset_job_stats() {}

#else

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}


// Message tags. Between two ranks MPI keeps messages of one tag in order, and rank 0 has at
// most one layer in flight, so a tag is all a message needs to be matched.
enum Tag : int { kCommand = 1, kRows = 2, kLoadStatus = 3, kFailure = 4, kStats = 5 };
enum Op : int64_t { kLoad = 1, kExperts = 2, kStop = 3, kStatsQuery = 4, kStatsReset = 5 };

// A byte buffer written and read field by field (memcpy: no alignment assumed).
struct Packer {
  std::vector<uint8_t> bytes;
  template <class T>
  void put(const T* p, size_t n) {
    const size_t at = bytes.size();
    bytes.resize(at + n * sizeof(T));
    if (n) std::memcpy(bytes.data() + at, p, n * sizeof(T));
  }
  template <class T>
  void put(T v) { put(&v, 1); }
};
struct Reader {
  const uint8_t* p;
  size_t left;
  template <class T>
  void get(T* out, size_t n) {
    if (n * sizeof(T) > left) throw Error("expert parallelism: a short message from rank 0");
    if (n) std::memcpy(out, p, n * sizeof(T));
    p += n * sizeof(T);
    left -= n * sizeof(T);
  }
  template <class T>
  T get() {
    T v{};
    get(&v, 1);
    return v;
  }
};

// Receives the next message of `tag` from `source` whole, whatever its size.
std::vector<uint8_t> receive_bytes(int source, int tag, MPI_Status* status_out = nullptr) {
  MPI_Status status;
  MPI_Probe(source, tag, MPI_COMM_WORLD, &status);
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  std::vector<uint8_t> bytes(size_t(std::max(count, 0)));
  MPI_Recv(bytes.data(), count, MPI_BYTE, status.MPI_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  if (status_out) *status_out = status;
  return bytes;
}

// Waits for a message of `tag` from rank 0 without holding a core: MPI's blocking receive polls,
// and an idle server's followers would each burn one. Polls for a while after the last message
// (the next layer's follows within microseconds during a forward pass), then sleeps between polls.
void wait_for_message(int source, int tag, double& idle_seconds) {
  const double t0 = now_seconds();
  int flag = 0;
  for (int spins = 0;; ++spins) {
    MPI_Iprobe(source, tag, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    if (flag) break;
    const double waited = now_seconds() - t0;
    if (waited < 0.0001) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(waited < 0.1 ? 50 : 1000));
  }
  idle_seconds += now_seconds() - t0;
}

uint64_t binary_fingerprint() {
  std::ifstream f("/proc/self/exe", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return fnv1a64(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

int g_rank = 0, g_size = 1;
bool g_active = false;  // MPI initialised and not yet finalised
int g_follower_threads = 0;
std::mutex g_mutex;     // rank 0: one MPI caller at a time (the engine thread, then exit)

// ---- rank 0 -------------------------------------------------------------------------------------

class MpiExpertParallel final : public ExpertParallel {
 public:
  int ranks() const override { return g_size; }

  void begin_load(const FollowerLoad& load) override {
    std::lock_guard<std::mutex> lock(g_mutex);
    Packer m;
    m.put<int64_t>(kLoad);
    m.put<int64_t>(load.mem_budget);
    m.put<int64_t>(load.expert_slots);
    m.put<int64_t>(load.io_threads);
    m.put<int64_t>(g_follower_threads);
    m.put<int64_t>(int64_t(load.dir.size()));
    m.put(load.dir.data(), load.dir.size());
    for (int r = 1; r < g_size; ++r)
      MPI_Send(m.bytes.data(), int(m.bytes.size()), MPI_BYTE, r, kCommand, MPI_COMM_WORLD);
    loads_pending_ = true;
  }

  void end_load(uint64_t checkpoint_fingerprint) override {
    std::lock_guard<std::mutex> lock(g_mutex);
    loads_pending_ = false;
    std::string problems;
    for (int r = 1; r < g_size; ++r) {
      const std::vector<uint8_t> bytes = receive_bytes(r, kLoadStatus);
      const nlohmann::json s = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
      const std::string who = "rank " + std::to_string(r) + " (" + (s.is_object() ? s.value("host", "?") : "?") + ")";
      if (!s.is_object()) problems += "\n  " + who + ": an unreadable load status";
      else if (!s.value("ok", false)) problems += "\n  " + who + ": " + s.value("error", "failed");
      else if (s.value("checkpoint", uint64_t(0)) != checkpoint_fingerprint)
        problems += "\n  " + who + ": its checkpoint differs from rank 0's (config or tensor list; every rank needs "
                    "the same checkpoint at the same path)";
      else {
        followers_[size_t(r)].expert_bytes = s.value("expert_bytes", int64_t(0));
        followers_[size_t(r)].memory_plan = s.value("memory_plan", std::string());
        followers_[size_t(r)].host = s.value("host", std::string("?"));
      }
    }
    if (!problems.empty()) throw Error("expert parallelism: the model could not be loaded on every rank:" + problems);
  }

  void start(int layer, int64_t D, const uint16_t* x, const int64_t* first, int E, const int* toks,
             const float* route_w, uint16_t* out) override {
    std::lock_guard<std::mutex> lock(g_mutex);
    const double t0 = now_seconds();
    requests_.clear();
    for (int r = 1; r < g_size; ++r) {
      // Rank r's experts: a contiguous block of ids, so a contiguous block of rows.
      int e0 = E, e1 = E;
      for (int e = 0; e < E; ++e)
        if (expert_owner(e, E, g_size) == r) { e0 = e; break; }
      for (int e = e0; e < E; ++e)
        if (expert_owner(e, E, g_size) != r) { e1 = e; break; }
      const int64_t r0 = first[e0], r1 = first[e1];
      if (r1 <= r0) continue;
      // The tokens these rows read, each sent once; the rows name them by index.
      std::vector<int> tokens(toks + r0, toks + r1);
      std::sort(tokens.begin(), tokens.end());
      tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
      std::vector<int32_t> ids;
      std::vector<int64_t> starts;
      for (int e = e0; e < e1; ++e)
        if (first[e + 1] > first[e]) {
          ids.push_back(e);
          starts.push_back(first[e] - r0);
        }
      starts.push_back(r1 - r0);
      Packer& m = outbox_[size_t(r)];
      m.bytes.clear();
      m.put<int64_t>(kExperts);
      m.put<int64_t>(layer);
      m.put<int64_t>(D);
      m.put<int64_t>(int64_t(tokens.size()));
      m.put<int64_t>(int64_t(ids.size()));
      m.put(ids.data(), ids.size());
      m.put(starts.data(), starts.size());
      for (int64_t row = r0; row < r1; ++row)
        m.put<int32_t>(int32_t(std::lower_bound(tokens.begin(), tokens.end(), toks[row]) - tokens.begin()));
      m.put(route_w + r0, size_t(r1 - r0));
      for (int t : tokens) m.put(x + int64_t(t) * D, size_t(D));
      MPI_Request send, recv;
      MPI_Irecv(out + r0 * D, int((r1 - r0) * D), MPI_UINT16_T, r, kRows, MPI_COMM_WORLD, &recv);
      MPI_Isend(m.bytes.data(), int(m.bytes.size()), MPI_BYTE, r, kCommand, MPI_COMM_WORLD, &send);
      requests_.push_back(recv);
      requests_.push_back(send);
      self_.bytes_sent += int64_t(m.bytes.size());
      self_.bytes_received += (r1 - r0) * D * 2;
      self_.messages += 2;
      self_.expert_rows += r1 - r0;
    }
    self_.send_seconds += now_seconds() - t0;
  }

  void finish() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (requests_.empty()) return;
    const double t0 = now_seconds();
    for (;;) {
      int done = 0;
      MPI_Testall(int(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
      if (done) break;
      int failed = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kFailure, MPI_COMM_WORLD, &failed, &status);
      if (failed) {
        const std::vector<uint8_t> text = receive_bytes(status.MPI_SOURCE, kFailure);
        for (MPI_Request& q : requests_)
          if (q != MPI_REQUEST_NULL) {
            MPI_Cancel(&q);
            MPI_Request_free(&q);
          }
        requests_.clear();
        throw Error("expert parallelism: rank " + std::to_string(status.MPI_SOURCE) + " (" +
                    followers_[size_t(status.MPI_SOURCE)].host + ") failed: " + std::string(text.begin(), text.end()));
      }
      sched_yield();
    }
    requests_.clear();
    self_.wait_seconds += now_seconds() - t0;
  }

  std::vector<RankStats> stats() {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::vector<RankStats> all{self_};
    all[0].host = host_name();
    const int64_t query = kStatsQuery;
    for (int r = 1; r < g_size; ++r) MPI_Send(&query, 1, MPI_INT64_T, r, kCommand, MPI_COMM_WORLD);
    for (int r = 1; r < g_size; ++r) {
      const std::vector<uint8_t> bytes = receive_bytes(r, kStats);
      const nlohmann::json s = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
      RankStats f = followers_[size_t(r)];
      f.rank = r;
      if (s.is_object()) {
        f.compute_seconds = s.value("compute_seconds", 0.0);
        f.send_seconds = s.value("send_seconds", 0.0);
        f.wait_seconds = s.value("wait_seconds", 0.0);
        f.bytes_sent = s.value("bytes_sent", int64_t(0));
        f.bytes_received = s.value("bytes_received", int64_t(0));
        f.messages = s.value("messages", int64_t(0));
        f.expert_rows = s.value("expert_rows", int64_t(0));
      }
      all.push_back(f);
    }
    return all;
  }

  void reset_stats() {
    std::lock_guard<std::mutex> lock(g_mutex);
    self_ = RankStats{};
    const int64_t reset = kStatsReset;
    for (int r = 1; r < g_size; ++r) MPI_Send(&reset, 1, MPI_INT64_T, r, kCommand, MPI_COMM_WORLD);
  }

  // Stops the followers (end_job).
  void stop() {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (loads_pending_)  // a load rank 0 gave up on: take the statuses so the followers' sends complete
      for (int r = 1; r < g_size; ++r) receive_bytes(r, kLoadStatus);
    loads_pending_ = false;
    const int64_t stop = kStop;
    for (int r = 1; r < g_size; ++r) MPI_Send(&stop, 1, MPI_INT64_T, r, kCommand, MPI_COMM_WORLD);
  }

  MpiExpertParallel() : outbox_(size_t(g_size)), followers_(size_t(g_size)) {}

 private:
  std::vector<Packer> outbox_;  // per rank: the message in flight (kept until its send completes)
  std::vector<MPI_Request> requests_;
  std::vector<RankStats> followers_;  // what each follower said at load
  RankStats self_;
  bool loads_pending_ = false;
};

std::shared_ptr<MpiExpertParallel> g_parallel;

// ---- followers ----------------------------------------------------------------------------------

struct Follower {
  std::unique_ptr<Model> model;
  std::unique_ptr<ThreadPool> pool;
  RankStats stats;
  std::string host = host_name();
  std::vector<uint16_t> out;

  void load(Reader& in) {
    Model::LoadOptions o;
    o.mem_budget = in.get<int64_t>();
    o.expert_slots = in.get<int64_t>();
    o.io_threads = int(in.get<int64_t>());
    const int threads = int(in.get<int64_t>());
    std::string dir(size_t(in.get<int64_t>()), '\0');
    in.get(dir.data(), dir.size());
    o.share = ExpertShare{g_rank, g_size, /*experts_only=*/true};
    nlohmann::json status = {{"host", host}};
    try {
      model.reset();
      model = Model::load(dir, {}, o);
      const int n = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
      if (!pool || pool->size() != n) pool = std::make_unique<ThreadPool>(n);
      status["ok"] = true;
      status["checkpoint"] = model->checkpoint_fingerprint();
      status["expert_bytes"] = model->memory_plan().expert_bytes;
      status["memory_plan"] = model->memory_plan().summary();
    } catch (const std::exception& e) {
      model.reset();
      status["ok"] = false;
      status["error"] = e.what();
    }
    const std::string text = status.dump();
    MPI_Send(text.data(), int(text.size()), MPI_BYTE, 0, kLoadStatus, MPI_COMM_WORLD);
  }

  void experts(Reader& in, size_t message_bytes) {
    const int layer = int(in.get<int64_t>());
    const int64_t D = in.get<int64_t>(), T = in.get<int64_t>(), n = in.get<int64_t>();
    if (D <= 0 || T < 0 || n < 0 || n > (int64_t(1) << 20)) throw Error("a malformed expert message");
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::vector<int64_t> first(size_t(n) + 1);
    in.get(ids.data(), ids.size());
    in.get(first.data(), first.size());
    const int64_t R = first.back();
    if (R < 0 || R > int64_t(message_bytes)) throw Error("a malformed expert message");
    std::vector<int32_t> row_token(static_cast<size_t>(R));
    std::vector<float> route_w(static_cast<size_t>(R));
    std::vector<uint16_t> tokens(size_t(T * D));
    in.get(row_token.data(), row_token.size());
    in.get(route_w.data(), route_w.size());
    in.get(tokens.data(), tokens.size());
    std::vector<uint16_t> xin(size_t(R * D));
    for (int64_t r = 0; r < R; ++r) {
      if (row_token[size_t(r)] < 0 || row_token[size_t(r)] >= T) throw Error("a malformed expert message");
      std::copy_n(tokens.data() + int64_t(row_token[size_t(r)]) * D, D, xin.data() + r * D);
    }
    out.resize(size_t(R * D));
    if (!model) throw Error("no model loaded on this rank");
    if (D != model->config().dim) throw Error("an expert message of width " + std::to_string(D));
    model->expert_products(layer, ids.data(), int(n), first.data(), xin.data(), route_w.data(), out.data(), pool.get());
    stats.expert_rows += R;
  }

  int serve() {
    for (;;) {
      wait_for_message(0, kCommand, stats.wait_seconds);
      const std::vector<uint8_t> bytes = receive_bytes(0, kCommand);
      stats.bytes_received += int64_t(bytes.size());
      stats.messages += 1;
      Reader in{bytes.data(), bytes.size()};
      const int64_t op = in.get<int64_t>();
      if (op == kStop) return 0;
      if (op == kLoad) {
        load(in);
      } else if (op == kExperts) {
        const double t0 = now_seconds();
        try {
          experts(in, bytes.size());
        } catch (const std::exception& e) {
          // Rank 0 is waiting for these rows: tell it why they will not come (it ends the request
          // with this message; this rank goes on serving).
          const std::string text = e.what();
          MPI_Send(text.data(), int(text.size()), MPI_BYTE, 0, kFailure, MPI_COMM_WORLD);
          stats.compute_seconds += now_seconds() - t0;
          continue;
        }
        const double t1 = now_seconds();
        stats.compute_seconds += t1 - t0;
        MPI_Send(out.data(), int(out.size()), MPI_UINT16_T, 0, kRows, MPI_COMM_WORLD);
        stats.send_seconds += now_seconds() - t1;
        stats.bytes_sent += int64_t(out.size()) * 2;
        stats.messages += 1;
      } else if (op == kStatsQuery) {
        const nlohmann::json s = {{"compute_seconds", stats.compute_seconds}, {"send_seconds", stats.send_seconds},
                                  {"wait_seconds", stats.wait_seconds},       {"bytes_sent", stats.bytes_sent},
                                  {"bytes_received", stats.bytes_received},   {"messages", stats.messages},
                                  {"expert_rows", stats.expert_rows}};
        const std::string text = s.dump();
        MPI_Send(text.data(), int(text.size()), MPI_BYTE, 0, kStats, MPI_COMM_WORLD);
      } else if (op == kStatsReset) {
        stats = RankStats{};
      } else {
        std::fprintf(stderr, "ds41 rank %d: unknown command %lld from rank 0\n", g_rank, (long long)op);
        return 1;
      }
    }
  }
};

// A signal from mpirun (another rank ended): say so on this rank before the default action.
void on_job_signal(int sig) {
  static const char msg[] = "ds41: the MPI job is being stopped (a rank ended or mpirun was interrupted; "
                            "mpirun's message names the rank)\n";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  (void)ignored;
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

int start_job(int argc, char** argv) {
  if (launcher_size() <= 1) return -1;
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "error: MPI_Init failed\n");
    return 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_active = true;
  if (provided < MPI_THREAD_SERIALIZED) {
    if (g_rank == 0) std::fprintf(stderr, "error: this MPI library does not allow calls from several threads\n");
    MPI_Finalize();
    g_active = false;
    return 1;
  }
  // Every rank must run the same binary: the message layouts and the kernels' bits are its own.
  const uint64_t mine = binary_fingerprint();
  std::vector<uint64_t> all(static_cast<size_t>(g_size));
  MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  std::vector<int> differ;
  for (int r = 1; r < g_size; ++r)
    if (all[size_t(r)] != all[0]) differ.push_back(r);
  if (!differ.empty()) {
    if (g_rank == 0) {
      std::string list;
      for (int r : differ) list += (list.empty() ? "" : ", ") + std::to_string(r);
      std::fprintf(stderr, "error: rank%s %s: a different ds41 binary from rank 0's (every host needs the same build)\n",
                   differ.size() > 1 ? "s" : "", list.c_str());
    }
    MPI_Finalize();
    g_active = false;
    return 1;
  }
  signal(SIGTERM, on_job_signal);
  if (g_rank == 0) {
    if (g_size > 1) g_parallel = std::make_shared<MpiExpertParallel>();
    std::atexit(end_job);
    return -1;
  }
  int status = 1;
  try {
    Follower f;
    status = f.serve();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ds41 rank %d: error: %s\n", g_rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  g_active = false;
  return status;
}

std::shared_ptr<ExpertParallel> expert_parallel() { return g_parallel; }
int job_ranks() { return g_active ? g_size : 1; }
void set_follower_threads(int threads) { g_follower_threads = threads; }

void end_job() {
  if (!g_active || g_rank != 0) return;
  if (g_parallel) g_parallel->stop();
  g_parallel.reset();
  MPI_Finalize();
  g_active = false;
}

std::vector<RankStats> job_stats() { return g_parallel ? g_parallel->stats() : std::vector<RankStats>{}; }
void reset_job_stats() {
  if (g_parallel) g_parallel->reset_stats();
}

#endif

}  // namespace ds41::dist
