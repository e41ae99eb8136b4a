// Routed experts held by other processes: expert parallelism across the ranks of an MPI job
// (the transport is dist/, this is what the model sees of it).
//
// Rank 0 runs the whole model except the routed experts other ranks own; a follower rank holds
// only its own routed experts (1/N of the expert bytes) and computes their rows when rank 0 sends
// them. Ownership is by contiguous blocks of expert ids, so one rank's experts are one range of
// the MoE's rows (which are grouped by ascending expert) and its results land there directly.
// Every expert row is computed by the same code on whichever rank owns it, and rank 0 adds them
// in the single-process order (ascending expert, shared expert last): outputs are bit-identical
// to one process.
#pragma once

#include <cstdint>
#include <string>

namespace ds41 {

// The rank that owns expert `e` of a layer with `experts` routed experts, among `ranks`:
// contiguous, balanced blocks (ranks r holds [ceil(r E / N), ceil((r + 1) E / N))).
inline int expert_owner(int e, int experts, int ranks) {
  return ranks <= 1 || experts <= 0 ? 0 : int((int64_t(e) * ranks) / experts);
}

// What a rank holds: every weight (rank 0), or only its own routed experts (a follower).
struct ExpertShare {
  int rank = 0, ranks = 1;
  bool experts_only = false;
  bool owns(int e, int experts) const { return expert_owner(e, experts, ranks) == rank; }
};

// What a follower rank is told to load: the checkpoint directory (the same path on every host)
// and its own memory options (model.h Model::LoadOptions).
struct FollowerLoad {
  std::string dir;
  int64_t mem_budget = 0, expert_slots = 0;
  int io_threads = 8;
};

// Rank 0's side of the job: the loads (Model::load) and the MoE of each layer.
class ExpertParallel {
 public:
  virtual ~ExpertParallel() = default;
  virtual int ranks() const = 0;

  // Tells every follower to load its share of `load.dir` (they load while rank 0 does).
  virtual void begin_load(const FollowerLoad& load) = 0;
  // Waits for the followers' loads. Throws ds41::Error naming the rank and host when one failed,
  // or when its binary or checkpoint differs from rank 0's (`checkpoint_fingerprint`: Model's).
  virtual void end_load(uint64_t checkpoint_fingerprint) = 0;

  // Sends the rows of the experts other ranks own, without waiting: x [S][dim] the layer's input,
  // rows grouped by ascending expert (first[e] .. first[e + 1] are expert e's, E + 1 entries),
  // toks[r] the token of row r, route_w[r] its routing weight. The owners' results are received
  // into out [R][dim] at their rows; finish() waits for them. Between the two, rank 0 computes its
  // own experts and the shared one. Throws ds41::Error when another rank reported a failure.
  virtual void start(int layer, int64_t dim, const uint16_t* x, const int64_t* first, int E, const int* toks,
                     const float* route_w, uint16_t* out) = 0;
  virtual void finish() = 0;
};

}  // namespace ds41
