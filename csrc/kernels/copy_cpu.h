// Copies into memory that another core reads next (a peer's slot).
#pragma once
#include <cstddef>

namespace rc {

/// memcpy(dst, src, n) for data another process reads next. With `stream` (and n >= 4 KiB, on
/// x86-64) the bytes are written with non-temporal (streaming) stores that go to memory instead of
/// this core's caches, followed by a store fence, so a release store that publishes the slot
/// afterwards orders after every byte. Which of the two is faster depends on where the reader
/// runs (comm/store_policy.h measures it): when writer and reader share an L3, the reader finds
/// cached lines sooner (streaming measured 1.6x slower); when they sit on different L3 domains
/// (seen on a 2-vCPU VM whose vCPUs the host moves between CCDs), pulling lines that are dirty in
/// the writer's cache runs at a third of the speed of reading them from memory.
void copy_to_peer(void* dst, const void* src, size_t n, bool stream);

}  // namespace rc
