// One model across the ranks of an MPI job (`mpirun -np N ds41 run|serve|chat|bench ...`): expert
// parallelism over OpenMPI (model/expert_parallel.h has the split and why outputs stay
// bit-identical; docs/multi-node.md the launch and the traffic).
//
// Rank 0 runs the command as in one process: the CLI, the HTTP server, attention, dense layers,
// Engram, the head and its own block of routed experts. Every other rank is a follower: it loads
// only its block of each layer's routed experts when rank 0 loads a model, then computes the rows
// rank 0 sends it, layer by layer, until rank 0 ends the job.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/expert_parallel.h"

namespace ds41::dist {

// Called first in main(). Outside an MPI job, or in a job of one rank: returns -1 and nothing
// changes. On rank 0 of a larger job: checks that every rank runs the same binary (refused with
// an error otherwise), returns -1, and expert_parallel() is then set. On a follower rank: serves
// rank 0 until the job ends and returns the process's exit status.
int start_job(int argc, char** argv);

// Rank 0 of a job of several ranks: the transport the model uses (Model::LoadOptions); null
// otherwise.
std::shared_ptr<ExpertParallel> expert_parallel();
int job_ranks();  // 1 outside a job
// Ends the job from rank 0: tells the followers to stop, then MPI_Finalize. Idempotent; also run
// at exit.
void end_job();
// The worker threads a follower runs its experts on (the command's --threads; 0 = its cores).
void set_follower_threads(int threads);

// Per-rank figures since the last reset, for `ds41 bench`: on rank 0 the MoE's sending
// (communication) and waiting for the others' rows; on a follower its expert compute and its idle
// wait for rank 0.
struct RankStats {
  int rank = 0;
  std::string host;
  double compute_seconds = 0;  // follower: computing experts
  double send_seconds = 0;     // packing and posting (rank 0), sending results (follower)
  double wait_seconds = 0;     // rank 0: waiting for the others' rows after its own; follower: idle
  int64_t bytes_sent = 0, bytes_received = 0, messages = 0;
  int64_t expert_rows = 0;     // rows this rank computed (follower) or sent out (rank 0)
  int64_t expert_bytes = 0;    // routed-expert bytes this rank holds (follower; rank 0: 0, see its memory plan)
  std::string memory_plan;     // follower: its load's memory plan (MemoryPlan::summary)
};
// Every rank's, rank 0 first (rank 0 only; empty outside a job).
std::vector<RankStats> job_stats();
void reset_job_stats();

}  // namespace ds41::dist
