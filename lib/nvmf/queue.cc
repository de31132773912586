#include "nvmf/queue.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace droce::nvmf {

Queue::Queue(Target& t, const QueueConfig& c, std::span<uint8_t> mem) : target_(t), cfg_(c) {
  slots_.resize(c.slots ? c.slots : c.depth);
  for (size_t i = 0; i < slots_.size(); ++i)
    slots_[i].buf = mem.size() >= (i + 1) * size_t{c.slot_buffer} ? mem.subspan(i * c.slot_buffer, c.slot_buffer)
                                                                  : std::span<uint8_t>{};
  actions_.resize(slots_.size() * 3);
}

Queue::~Queue() {
  if (cfg_.ring && backend_busy()) cfg_.ring->abandon(this);
  if (!cntlid_ || !ctrl_) return;
  if (cfg_.qid == 0)
    target_.destroy(cntlid_);
  else
    target_.io_queue_closed(*ctrl_, cfg_.qid);
}

Controller* Queue::controller() noexcept { return ctrl_ && !ctrl_->gone() ? ctrl_.get() : nullptr; }

size_t Queue::busy() const noexcept {
  return static_cast<size_t>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.state != State::Free; }));
}

size_t Queue::backend_busy() const noexcept {
  return static_cast<size_t>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.state == State::WaitingForBackend || s.held; }));
}

void Queue::push(const Action& a) {
  if (act_count_ == actions_.size()) {  // cannot happen: two actions per slot at most
    failed_ = true;
    return;
  }
  actions_[(act_head_ + act_count_) % actions_.size()] = a;
  ++act_count_;
}

size_t Queue::take_actions(std::span<Action> out) noexcept {
  size_t n = std::min(out.size(), act_count_);
  for (size_t i = 0; i < n; ++i) {
    out[i] = actions_[act_head_];
    act_head_ = (act_head_ + 1) % actions_.size();
  }
  act_count_ -= n;
  return n;
}

void Queue::on_capsule(std::span<const uint8_t> cap, uint64_t now_ns) {
  if (cap.size() < kSqeSize) {
    ++ctr_.short_capsules;
    return;
  }
  uint16_t i = 0;
  while (i < slots_.size() && slots_[i].state != State::Free) ++i;
  if (i == slots_.size()) {  // the host sent more than its queue size
    ++ctr_.overflow;
    return;
  }
  ++ctr_.commands;
  sq_head_ = static_cast<uint16_t>((sq_head_ + 1) % cfg_.depth);
  Slot& s = slots_[i];
  s.arrival_ns = now_ns;
  s.timed = true;
  decode_sqe(cap.first<kSqeSize>(), s.sqe);
  s.plan = DataPlan{};
  Status st = plan_data(s.sqe, cap.size() - kSqeSize, static_cast<uint32_t>(s.buf.size()), s.plan);
  if (!st.ok()) {
    s.plan.invalidate = false;  // a malformed SGL: do not trust its key
    Cqe c;
    c.cid = s.sqe.cid;
    c.status = st;
    return respond(i, c);
  }
  bool connect = s.sqe.opcode == static_cast<uint8_t>(AdminOp::Fabrics) &&
                 s.sqe.fctype() == static_cast<uint8_t>(FabricsType::Connect);
  if (!cntlid_ && !connect) {
    Cqe c;
    c.cid = s.sqe.cid;
    c.status = sc::kCmdSeqError;
    return respond(i, c);
  }
  if (s.plan.where == DataPlan::InCapsule) {
    std::memcpy(s.buf.data(), cap.data() + kSqeSize + s.plan.offset, s.plan.length);
    ctr_.bytes_in += s.plan.length;
  } else if (s.plan.where == DataPlan::RemoteKey && data_direction(s.sqe) == DataDir::HostToCtrl) {
    s.state = State::ReadingFromHost;
    return push(Action{Action::RdmaRead, i, s.buf.data(), s.plan.length, s.plan.addr, s.plan.key, false});
  }
  execute(i, now_ns);
}

void Queue::execute(uint16_t i, uint64_t now_ns) {
  Slot& s = slots_[i];
  std::span<uint8_t> data = s.buf.first(s.plan.length);
  bool fabrics = s.sqe.opcode == static_cast<uint8_t>(AdminOp::Fabrics);
  if (fabrics && s.sqe.fctype() == static_cast<uint8_t>(FabricsType::Connect) && !cntlid_) {
    Target::Connected r = target_.connect(s.sqe, data, cfg_.qid, now_ns);
    if (r.ctrl) {
      cntlid_ = r.ctrl->cntlid();
      ctrl_ = std::move(r.ref);
    }
    Response resp;
    resp.cqe = r.cqe;
    return finish(i, resp);
  }
  Controller* c = controller();
  Response r;
  if (!c) {  // its admin queue went away
    r.cqe.cid = s.sqe.cid;
    r.cqe.status = sc::kCmdSeqError;
  } else if (cfg_.qid == 0) {
    std::lock_guard lk(target_.mutex());  // I/O Connects on other threads read what admin commands change
    r = c->execute_admin(s.sqe, data, now_ns);
  } else if (fabrics) {
    r.cqe.cid = s.sqe.cid;
    r.cqe.status = s.sqe.fctype() == static_cast<uint8_t>(FabricsType::Connect) ? sc::kCmdSeqError : sc::kInvalidOpcode;
  } else {
    r = c->execute_io(s.sqe, data);
    if (r.pending) return start_file(i, r);
  }
  finish(i, r);
}

void Queue::start_file(uint16_t i, const Response& r) {
  Slot& s = slots_[i];
  if (!cfg_.ring) {
    ++ctr_.no_ring;
    Cqe c;
    c.cid = s.sqe.cid;
    c.status = sc::kInternal;
    return respond(i, c);
  }
  ++ctr_.file_commands;
  s.state = State::WaitingForBackend;
  s.file.owner = this;
  s.file.slot = i;
  s.file.ns = r.ns;
  s.file.op = r.file;
  s.file.buf = s.buf.data();
  cfg_.ring->start(s.file);
}

void Queue::backend_done(uint16_t slot, Status st, uint32_t data_len) noexcept {
  if (slot >= slots_.size() || slots_[slot].state != State::WaitingForBackend) {
    ++ctr_.bad_completions;
    return;
  }
  Response r;
  r.cqe.cid = slots_[slot].sqe.cid;
  r.cqe.status = st;
  r.data_len = st.ok() ? data_len : 0;
  finish(slot, r);
}

void Queue::backend_stuck(uint16_t slot) noexcept {
  if (slot >= slots_.size() || slots_[slot].state != State::WaitingForBackend) {
    ++ctr_.bad_completions;
    return;
  }
  slots_[slot].held = true;
  Cqe c;
  c.cid = slots_[slot].sqe.cid;
  c.status = sc::kInternal;
  respond(slot, c);
}

void Queue::backend_released(uint16_t slot) noexcept {
  if (slot >= slots_.size() || !slots_[slot].held) {
    ++ctr_.bad_completions;
    return;
  }
  slots_[slot].held = false;
  if (slots_[slot].state == State::Held) slots_[slot].state = State::Free;
}

void Queue::finish(uint16_t i, const Response& r) {
  Slot& s = slots_[i];
  if (r.deferred) {
    s.state = State::Deferred;
    s.timed = false;  // an AER: its wait is the event's, not the target's
    return;
  }
  if (r.cqe.status.ok() && r.data_len && s.plan.where == DataPlan::RemoteKey &&
      data_direction(s.sqe) == DataDir::CtrlToHost) {
    uint32_t n = std::min(r.data_len, s.plan.length);
    // RC ordering: the WRITE lands before the response SEND that follows it.
    push(Action{Action::RdmaWrite, i, s.buf.data(), n, s.plan.addr, s.plan.key, false});
    ctr_.bytes_out += n;
  }
  respond(i, r.cqe);
}

void Queue::respond(uint16_t i, Cqe c) {
  Slot& s = slots_[i];
  c.sq_head = sq_head_;
  c.sq_id = cfg_.qid;
  if (!c.status.ok()) ++ctr_.errors;
  encode_cqe(s.cqe, c);
  s.state = State::Completing;
  push(Action{Action::Send, i, s.cqe.data(), kCqeSize, 0, s.plan.key, s.plan.invalidate});
}

void Queue::on_complete(uint16_t slot, Action::Kind kind, bool ok, uint64_t now_ns) {
  if (slot >= slots_.size()) {
    ++ctr_.bad_completions;
    return;
  }
  Slot& s = slots_[slot];
  if (!ok) {
    failed_ = true;
    s.state = s.held ? State::Held : State::Free;
    return;
  }
  if (kind == Action::RdmaRead && s.state == State::ReadingFromHost) {
    ctr_.bytes_in += s.plan.length;
    return execute(slot, now_ns);
  }
  if (kind == Action::Send && s.state == State::Completing) {
    s.state = s.held ? State::Held : State::Free;
    if (s.timed) ctr_.latency.add(now_ns >= s.arrival_ns ? now_ns - s.arrival_ns : 0);
    s.timed = false;
    return;
  }
  if (kind == Action::RdmaWrite && s.state == State::Completing) return;  // a signalled WRITE
  ++ctr_.bad_completions;
}

void Queue::poll() {
  if (cfg_.qid != 0 || !cntlid_) return;
  Controller* c = controller();
  if (!c) return;
  Cqe a;
  while (c->take_async(a)) {
    auto it = std::find_if(slots_.begin(), slots_.end(),
                           [&](const Slot& s) { return s.state == State::Deferred && s.sqe.cid == a.cid; });
    if (it == slots_.end()) {
      ++ctr_.bad_completions;
      continue;
    }
    respond(static_cast<uint16_t>(it - slots_.begin()), a);
  }
  // AERs a controller reset dropped: answered as aborted.
  for (uint16_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].state != State::Deferred || c->aer_pending(slots_[i].sqe.cid)) continue;
    Cqe ab;
    ab.cid = slots_[i].sqe.cid;
    ab.status = sc::kAbortReq;
    respond(i, ab);
  }
}

}  // namespace droce::nvmf
