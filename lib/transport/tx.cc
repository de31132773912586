// The TX batch: buffers lent by the backend, frames built into them (from
// whole headers, from a QP's template, or in one call by emit_copy), the
// batch's ICRCs and its flush to PacketIo::tx_burst.
#include <cstring>

#include "transport/engine.h"
#include "wire/icrc.h"

namespace droce::transport {

io::PktBuf* Engine::take_tx_buf(size_t frame_len) noexcept {
  if (tx_len_ >= kBurst) flush_tx();
  if (tx_len_ >= kBurst) {
    tx_blocked_ = true;
    return nullptr;
  }
  if (spare_len_ == 0) spare_len_ = io_.alloc_burst(spare_, kBurst);
  if (spare_len_ == 0) {
    count(Ctr::TxNoBuf);
    tx_blocked_ = true;
    return nullptr;
  }
  io::PktBuf* b = spare_[--spare_len_];
  if (frame_len > b->cap) {  // the whole frame must fit: the backend's copy fallback
    spare_[spare_len_++] = b;
    count(Ctr::TxNoBuf);
    return nullptr;
  }
  return b;
}

uint8_t* Engine::begin_frame(const wire::Headers& h, uint32_t payload_len) noexcept {
  const wire::FrameShape s = wire::frame_shape(h);
  io::PktBuf* b = take_tx_buf(wire::frame_len(s, payload_len));
  if (!b) return nullptr;
  const size_t hl = wire::build_headers({b->data, b->cap}, h, payload_len);
  cur_ = b;
  cur_shape_ = s;
  cur_plen_ = payload_len;
  return b->data + hl;
}

uint8_t* Engine::begin_frame(const wire::TxTemplate& t, const wire::PacketFields& f, uint32_t payload_len) noexcept {
  const wire::FrameShape s = wire::frame_shape(t, f.opcode);
  io::PktBuf* b = take_tx_buf(wire::frame_len(s, payload_len));
  if (!b) return nullptr;
  const size_t hl = wire::build_headers({b->data, b->cap}, t, f, payload_len);
  cur_ = b;
  cur_shape_ = s;
  cur_plen_ = payload_len;
  return b->data + hl;
}

bool Engine::emit_copy(const wire::TxTemplate& t, const wire::PacketFields& f, const uint8_t* src,
                       uint32_t len) noexcept {
  const wire::OpcodeInfo& op = wire::opcode_info(f.opcode);
  const size_t hdr = t.bth_off() + op.hdr_len;
  const uint8_t pad = (op.flags & wire::kOpPayload) ? wire::pad_for(len) : 0;
  const size_t body_end = hdr + len + pad;
  io::PktBuf* b = take_tx_buf(body_end + wire::kIcrcSize);
  if (!b) return false;
  uint8_t* p = b->data;
  if (wire::build_headers({p, b->cap}, t, f, len) != hdr) {  // an invalid opcode: nothing queued
    spare_[spare_len_++] = b;
    return false;
  }
  std::memcpy(p + hdr, src, len);
  std::memset(p + hdr + len, 0, pad);
  // The ICRC is left for flush_tx, with the batch's others (finish_icrcs).
  icrc_pend_[icrc_pend_len_++] = {p + t.l2_len, static_cast<uint32_t>(body_end - t.l2_len), t.l3_len, t.ipv6};
  b->len = static_cast<uint32_t>(body_end + wire::kIcrcSize);
  tx_[tx_len_++] = b;
  count(Ctr::TxFrames);
  if (len) count(Ctr::TxCopied);
  return true;
}

void Engine::end_frame() noexcept {
  io::PktBuf* b = cur_;
  cur_ = nullptr;
  b->len = static_cast<uint32_t>(wire::finish_frame({b->data, b->cap}, cur_shape_, cur_plen_));
  tx_[tx_len_++] = b;
  count(Ctr::TxFrames);
}

void Engine::end_frame_with(uint8_t* dst, const uint8_t* src, void* dma) noexcept {
  const uint32_t len = cur_plen_;
  if (dma && zero_copy_ && len >= cfg_.zero_copy_min) {
    io::PktBuf* b = cur_;
    cur_ = nullptr;
    b->len = static_cast<uint32_t>(dst - b->data);
    b->ext = src;
    b->ext_ref = dma;
    b->ext_len = len;
    b->tail_len = static_cast<uint8_t>(wire::finish_frame_ext({b->data, b->len}, cur_shape_, src, len, b->tail));
    tx_[tx_len_++] = b;
    count(Ctr::TxFrames);
    count(Ctr::TxZeroCopy);
    return;
  }
  if (len) {
    std::memcpy(dst, src, len);
    count(Ctr::TxCopied);
  }
  end_frame();
}

void Engine::finish_icrcs() noexcept {
  uint32_t icrc[kBurst];
  wire::icrc_compute_burst(icrc_pend_, icrc_pend_len_, icrc);
  for (uint16_t k = 0; k < icrc_pend_len_; ++k)
    wire::icrc_store(const_cast<uint8_t*>(icrc_pend_[k].l3) + icrc_pend_[k].len, icrc[k]);  // our TX buffer
  icrc_pend_len_ = 0;
}

void Engine::flush_tx() noexcept {
  if (tx_len_ == 0) return;
  if (icrc_pend_len_) finish_icrcs();
  const uint16_t sent = io_.tx_burst(tx_, tx_len_);
  if (sent < tx_len_) {
    std::memmove(tx_, tx_ + sent, (tx_len_ - sent) * sizeof(tx_[0]));
    tx_blocked_ = true;
  }
  tx_len_ = static_cast<uint16_t>(tx_len_ - sent);
}

}  // namespace droce::transport
