#include "proto/ll.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "transport/futex.h"

namespace rc {

namespace {
constexpr size_t kHead = kHeaderBytes;
constexpr size_t kLine = LLLine::kPayload;
}  // namespace

void LLProtocol::write(uint64_t seq, const HeaderBlob& h, const void* data, size_t bytes, size_t skip_from,
                        size_t skip_bytes) {
  RC_CHECK(bytes <= max_bytes(), InvalidArgument,
           "ringcomm: " << bytes << " bytes do not fit the LL outbox (" << max_bytes() << " bytes)");
  LLLine* lines = t_->ll_outbox(t_->rank(), seq);
  const char* src = static_cast<const char*>(data);
  const size_t first = std::min(bytes, kLine - kHead);
  std::memcpy(lines[0].payload, h.bytes, kHead);
  if (first > 0) std::memcpy(lines[0].payload + kHead, src, first);
  lines[0].flag.store(seq, std::memory_order_release);
  size_t done = first;
  size_t i = 1;
  auto skipped = [&](size_t len) { return done >= skip_from && done + len <= skip_from + skip_bytes; };
  // Whole lines with a fixed-size copy (inlined: a few vector moves), then the last one.
  for (; bytes - done >= kLine; ++i, done += kLine) {
    if (skipped(kLine)) continue;
    std::memcpy(lines[i].payload, src + done, kLine);
    lines[i].flag.store(seq, std::memory_order_release);
  }
  if (done < bytes && !skipped(bytes - done)) {
    std::memcpy(lines[i].payload, src + done, bytes - done);
    lines[i].flag.store(seq, std::memory_order_release);
  }
}

void LLProtocol::read(int peer, uint64_t seq, void* dst, size_t bytes, const WaitCtx& w, size_t from) {
  RC_CHECK(from <= max_bytes() && bytes <= max_bytes() - from, InvalidArgument,
           "ringcomm: bytes " << from << " to " << from + bytes << " do not fit the LL outbox (" << max_bytes()
                              << " bytes)");
  const LLLine* lines = t_->ll_outbox(peer, seq);
  char* out = static_cast<char*>(dst);
  size_t done = 0;
  // Data byte d is stream byte kHead + d: line (kHead + d) / kLine, at (kHead + d) % kLine.
  size_t i = (kHead + from) / kLine, at = (kHead + from) % kLine;
  do {
    const LLLine& line = lines[i];
    if (line.flag.load(std::memory_order_acquire) != seq) {
      // The owner is still writing (it posts its header after its last line), or never will.
      bool ready = false;
      for (int k = 0; k < 256 && !ready; ++k) {
        cpu_relax();
        ready = line.flag.load(std::memory_order_acquire) == seq;
      }
      if (!ready) {
        WaitCtx ww = w;
        ww.peer = peer;
        ww.what = "LL data";
        t_->wait_line_or_header(peer, seq, line.flag, ww);
        if (line.flag.load(std::memory_order_acquire) != seq) {
          RC_THROW(Error, "ringcomm: " << ww.op << " (seq " << seq << ") on rank " << t_->rank() << ": line " << i
                          << " of rank " << peer << "'s LL outbox holds seq " << line.flag.load(std::memory_order_relaxed)
                          << " after it posted its header (the ranks' streams diverged)");
        }
      }
    }
    const size_t n = std::min(bytes - done, kLine - at);
    if (n == kLine) {
      std::memcpy(out + done, line.payload, kLine);  // fixed size: inlined
    } else if (n > 0) {
      std::memcpy(out + done, line.payload + at, n);
    }
    done += n;
    at = 0;
    ++i;
  } while (done < bytes);
}

char* LLProtocol::stage(int i) {
  const size_t each = max_bytes();
  if (stage_.empty()) stage_.resize(each * static_cast<size_t>(t_->world()) + 1);
  return stage_.data() + each * static_cast<size_t>(i);
}

}  // namespace rc
