// Gather and scatter over a work request's SGE list through the MR table
// (the requester's payloads, the responder's and completer's placement).
#include <cstring>

#include "transport/engine.h"

namespace droce::transport {

bool gather(const verbs::MrTable& mrs, uint32_t pd, const verbs::SendWqe& w, uint32_t off, uint8_t* dst,
            uint32_t len) noexcept {
  if (len == 0) return true;
  if (w.is_inline) {
    if (off + len > w.length) return false;
    std::memcpy(dst, w.inline_data + off, len);
    return true;
  }
  for (uint32_t i = 0; i < w.wr.num_sge && len > 0; ++i) {
    const verbs::Sge& s = w.wr.sg_list[i];
    if (off >= s.length) {
      off -= s.length;
      continue;
    }
    const uint32_t n = s.length - off < len ? s.length - off : len;
    const uint8_t* src = mrs.lookup(s.lkey, pd, s.addr + off, n, 0, nullptr);
    if (!src) return false;
    std::memcpy(dst, src, n);
    dst += n;
    len -= n;
    off = 0;
  }
  return len == 0;
}

const uint8_t* gather_ref(const verbs::MrTable& mrs, uint32_t pd, const verbs::SendWqe& w, uint32_t off,
                          uint32_t len, void** dma) noexcept {
  if (w.is_inline || len == 0) return nullptr;
  for (uint32_t i = 0; i < w.wr.num_sge; ++i) {
    const verbs::Sge& s = w.wr.sg_list[i];
    if (off >= s.length) {
      off -= s.length;
      continue;
    }
    if (s.length - off < len) return nullptr;  // spans two SGEs: copy
    return mrs.lookup(s.lkey, pd, s.addr + off, len, 0, nullptr, dma);
  }
  return nullptr;
}

bool scatter(const verbs::MrTable& mrs, uint32_t pd, const verbs::Sge* sge, uint32_t num_sge, uint32_t off,
             const uint8_t* src, uint32_t len) noexcept {
  if (len == 0) return true;
  for (uint32_t i = 0; i < num_sge && len > 0; ++i) {
    const verbs::Sge& s = sge[i];
    if (off >= s.length) {
      off -= s.length;
      continue;
    }
    const uint32_t n = s.length - off < len ? s.length - off : len;
    uint8_t* dst = mrs.lookup(s.lkey, pd, s.addr + off, n, verbs::kAccessLocalWrite, nullptr);
    if (!dst) return false;
    std::memcpy(dst, src, n);
    src += n;
    len -= n;
    off = 0;
  }
  return len == 0;
}

}  // namespace droce::transport
