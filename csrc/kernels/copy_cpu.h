// Copies into memory that another core reads next (a peer's slot).
#pragma once
#include <cstddef>

namespace rc {

/// memcpy(dst, src, n) for data another process reads next. With `stream` (and n >= 4 KiB, on
/// x86-64) the bytes are written with non-temporal (streaming) stores that go to memory instead of
/// this core's caches, followed by a store fence, so a release store that publishes the slot
/// afterwards orders after every byte. Which of the two is faster depends on where the reader
/// runs (the selection's store policy chooses, comm/selection.h; docs/algorithms.md has the
/// measurements): a reader sharing the writer's L3 finds cached lines sooner, one on another L3
/// domain may read memory faster than lines dirty in the writer's cache.
void copy_to_peer(void* dst, const void* src, size_t n, bool stream);

}  // namespace rc
