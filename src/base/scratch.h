// Function-local buffers that keep their capacity from one call to the next, so that a
// steady-state decode step allocates nothing (issue #10): the first calls size them (a prefill
// leaves them at its size), later calls of the same or a smaller shape reuse the memory. Each
// call site has its own buffer per thread, so the buffers of one call chain never alias and the
// thread pool's workers never share one.
//
//   DS41_SCRATCH(T, name, n)  declares `std::vector<T>& name` holding n value-initialised
//                             elements: the allocation-free form of `std::vector<T> name(n)`.
//   DS41_SCRATCH_EMPTY(T, name) the same, emptied (for buffers filled by push_back/resize).
//   DS41_SCRATCH_CAP(T, name, n, cap) like DS41_SCRATCH, with room for `cap` elements reserved
//                             first (sizes that grow with the context are planned up front).
//   DS41_SCRATCH_UNINIT(T, name, n, cap) like DS41_SCRATCH_CAP, but holding at least n elements
//                             that keep whatever an earlier call left (the buffer only grows;
//                             new elements start as T{}): for buffers whose first n elements the
//                             caller writes before reading them, where zero-filling each call
//                             would be a wasted pass over memory.
// Buffers grow geometrically, so sizes that creep up by one per call reallocate rarely.
//
// Only for functions that are not re-entered on one thread while their buffer is in use (no
// recursion; the model's forward pass runs its layers one after another).
#pragma once

#include <cstddef>
#include <vector>

namespace ds41 {
template <class T>
void scratch_reserve(std::vector<T>& v, size_t n) {
  if (n > v.capacity()) v.reserve(n > 2 * v.capacity() ? n : 2 * v.capacity());
}
template <class T>
void scratch_grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}
}  // namespace ds41

#define DS41_SCRATCH_CAP(T, name, n, cap)                                \
  static thread_local std::vector<T> name##_scratch_;                    \
  ::ds41::scratch_reserve(name##_scratch_, static_cast<size_t>(cap));    \
  ::ds41::scratch_reserve(name##_scratch_, static_cast<size_t>(n));      \
  name##_scratch_.assign(static_cast<size_t>(n), T{});                   \
  std::vector<T>& name = name##_scratch_

#define DS41_SCRATCH(T, name, n) DS41_SCRATCH_CAP(T, name, n, 0)
#define DS41_SCRATCH_UNINIT(T, name, n, cap)                             \
  static thread_local std::vector<T> name##_scratch_;                    \
  ::ds41::scratch_reserve(name##_scratch_, static_cast<size_t>(cap));    \
  ::ds41::scratch_reserve(name##_scratch_, static_cast<size_t>(n));      \
  ::ds41::scratch_grow(name##_scratch_, static_cast<size_t>(n));         \
  std::vector<T>& name = name##_scratch_

#define DS41_SCRATCH_EMPTY(T, name)                  \
  static thread_local std::vector<T> name##_scratch_; \
  name##_scratch_.clear();                            \
  std::vector<T>& name = name##_scratch_
