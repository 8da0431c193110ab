// PinnedRing: one page-locked (or page-aligned) host arena, carved into exact-size blocks in FIFO
// order with wrap-around. A block's bytes are handed out again only after its fence completed:
// every host tensor viewing it has been freed (the consumer released it) and every copy from it
// recorded with record_many() has finished (memory/fence.h).
#pragma once

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "memory/fence.h"

namespace torchfeed {

struct RingStats {
  int64_t capacity = 0;
  int64_t bytes_in_use = 0;  // live blocks, plus the unusable tail skipped by a wrap
  int64_t high_water = 0;    // the most bytes_in_use ever reached
  int64_t blocks_in_flight = 0;
  int64_t allocations = 0;
  int64_t waits = 0;          // allocations that had to wait for a fence
  double wait_seconds = 0.0;  // total time spent waiting
  bool pinned = false;        // page-locked through the CUDA runtime
  bool locked = false;        // mlock()-ed
};

struct RingBlockInfo {
  int64_t id, offset, size;
  bool host_held;
  int64_t pending_copies;
};

class PinnedRing : public std::enable_shared_from_this<PinnedRing> {
 public:
  // pinned: 1 require page-locked memory (CUDA), 0 ordinary page-aligned memory, -1 page-locked
  // when a GPU is usable now. lock_memory: mlock() ordinary memory (refused beyond
  // RLIMIT_MEMLOCK, with the numbers).
  static std::shared_ptr<PinnedRing> create(int64_t capacity, int64_t alignment, int pinned,
                                            bool lock_memory);
  ~PinnedRing();

  // A uint8 tensor [nbytes] over a fresh block. Blocks while the ring is full, up to timeout_s
  // (< 0: without limit); the block is held until the tensor's storage (and every view of it)
  // is freed.
  at::Tensor allocate(int64_t nbytes, double timeout_s);
  // Fences the blocks under `views` (each once) after the work queued now on `stream` (a
  // cudaStream_t as an integer, on `device`): enqueue the copies first. Returns how many.
  int64_t record_many(const std::vector<at::Tensor>& views, int64_t stream, int64_t device);
  // Stages `sources` (CPU tensors) into `block` (a tensor over a live block of this ring, as
  // allocate() returned it) at byte `offsets`, and copies the block's bytes to `target` (a
  // contiguous uint8 tensor of the block's size, on a CUDA device; on the CPU it is a plain
  // copy, for tests) in chunks of `chunk_bytes`: each chunk's copy is queued on `stream` as
  // soon as that chunk is staged, so staging chunk k + 1 overlaps the transfer of chunk k, and
  // the staging of a chunk is split over the intra-op threads. Fences the block once, after the
  // last chunk. Returns the number of chunks.
  int64_t stage_and_copy(const std::vector<at::Tensor>& sources,
                         const std::vector<int64_t>& offsets, const at::Tensor& block,
                         const at::Tensor& target, int64_t stream, int64_t chunk_bytes);
  // No more allocations; frees the arena once no copy from it is pending (waits up to
  // timeout_s, < 0: without limit, for those).
  void close(double timeout_s);

  RingStats stats();
  std::vector<RingBlockInfo> blocks();
  int64_t capacity() const { return capacity_; }
  int64_t alignment() const { return alignment_; }
  bool pinned() const { return pinned_; }
  // Where the arena starts (0 once freed): tells ring tensors from others.
  int64_t data_address() const { return reinterpret_cast<int64_t>(base_); }
  bool closed();

 private:
  struct Block {
    int64_t id, offset, size;
    bool host_held = true;
    int64_t pending_copies = 0;
  };

  PinnedRing(int64_t capacity, int64_t alignment, bool pinned, bool lock_memory);
  int64_t block_of(const void* p);  // the id of the live block holding p (throws if none)
  void host_release(int64_t id);
  void copies_done(int64_t id);
  Block* find_locked(int64_t id);
  // Pops the leading blocks whose fences completed.
  void reclaim_locked();
  bool fits_locked(int64_t size, int64_t* offset);
  int64_t in_use_locked() const;
  std::string describe_locked(int64_t request) const;
  void free_arena_locked();

  const int64_t capacity_;
  const int64_t alignment_;
  bool pinned_ = false;
  bool locked_ = false;
  uint8_t* base_ = nullptr;
  std::mutex mu_;
  std::condition_variable released_;
  std::deque<Block> blocks_;
  int64_t next_id_ = 0;
  bool closed_ = false;
  RingStats stats_;
};

}  // namespace torchfeed
