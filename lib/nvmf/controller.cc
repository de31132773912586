#include "nvmf/controller.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "nvmf/le.h"

namespace droce::nvmf {

namespace {
Response done(const Sqe& s, Status st, uint64_t result = 0, uint32_t len = 0) {
  Response r;
  r.cqe.cid = s.cid;
  r.cqe.status = st;
  r.cqe.result = result;
  r.data_len = st.ok() ? len : 0;
  return r;
}
bool printable(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}
// Keep-alive deadline: KATO plus half of it, for hosts that send exactly
// every KATO (older Linux) rather than every KATO/2.
uint64_t ka_deadline(uint64_t now_ns, uint32_t kato_ms) {
  return now_ns + (uint64_t{kato_ms} + kato_ms / 2) * 1000000ull;
}
// Asynchronous event result: type Notice (2), info Namespace Attribute Changed
// (0), log page Changed Namespace List (04h).
constexpr uint32_t kAenNsChanged = 0x2u | (0x00u << 8) | (0x04u << 16);
constexpr uint32_t kAecNsAttr = 1u << 8;
}  // namespace

// ---------------------------------------------------------------- Subsystem

Subsystem::Subsystem(std::string nqn, std::string serial, std::string model, bool allow_any_host)
    : nqn_(std::move(nqn)), serial_(std::move(serial)), model_(std::move(model)), allow_any_(allow_any_host) {
  if (!valid_nqn(nqn_)) throw std::invalid_argument("subsystem nqn: malformed NQN '" + nqn_ + "'");
  if (serial_.size() > 20 || !printable(serial_))
    throw std::invalid_argument("subsystem " + nqn_ + " serial: at most 20 printable ASCII characters");
  if (model_.size() > 40 || !printable(model_))
    throw std::invalid_argument("subsystem " + nqn_ + " model: at most 40 printable ASCII characters");
}

void Subsystem::allow_host(std::string hostnqn) {
  if (!valid_nqn(hostnqn)) throw std::invalid_argument("subsystem " + nqn_ + " hosts: malformed NQN '" + hostnqn + "'");
  hosts_.push_back(std::move(hostnqn));
}

bool Subsystem::host_allowed(std::string_view hostnqn) const noexcept {
  if (allow_any_) return true;
  return std::find(hosts_.begin(), hosts_.end(), hostnqn) != hosts_.end();
}

Namespace& Subsystem::add_namespace(std::unique_ptr<Namespace> ns) {
  uint32_t id = ns->nsid();
  if (ns_.count(id)) throw std::invalid_argument("subsystem " + nqn_ + " namespace " + std::to_string(id) + ": duplicate nsid");
  Namespace& ref = *ns;
  ns_.emplace(id, std::move(ns));
  nsids_.insert(std::upper_bound(nsids_.begin(), nsids_.end(), id), id);
  return ref;
}

bool Subsystem::has_file_namespace() const noexcept {
  return std::any_of(ns_.begin(), ns_.end(), [](const auto& kv) { return kv.second->is_file(); });
}

Namespace* Subsystem::ns(uint32_t nsid) const noexcept {
  auto it = ns_.find(nsid);
  return it == ns_.end() ? nullptr : it->second.get();
}

// --------------------------------------------------------------- Controller

Controller::Controller(const Target& t, Subsystem& s, uint16_t cntlid, const ConnectData& host, uint32_t kato_ms,
                       uint64_t now_ns)
    : target_(t), sub_(s), cntlid_(cntlid), hostnqn_(host.hostnqn), hostid_(host.hostid), kato_ms_(kato_ms) {
  const TargetConfig& c = t.config();
  uint16_t depth = s.is_discovery() ? c.admin_queue_depth : c.max_queue_depth;
  cap_ = cap::make(static_cast<uint16_t>(depth - 1), false, 15);  // CSTS.RDY within 7.5 s
  io_queues_ = s.is_discovery() ? 0 : c.max_io_queues;
  ioq_.assign(size_t{c.max_io_queues} + 1, false);
  ka_deadline_ns_ = ka_deadline(now_ns, kato_ms_);
}

void Controller::reset() noexcept {
  csts_ &= ~csts::kRdy;
  ++generation_;
  std::fill(ioq_.begin(), ioq_.end(), false);
  aer_cids_.clear();
  events_.clear();
  async_out_.clear();
  aec_ = 0;
  io_queues_set_ = false;
  io_queues_ = sub_.is_discovery() ? 0 : target_.config().max_io_queues;
}

Response Controller::execute_admin(const Sqe& s, std::span<uint8_t> data, uint64_t now_ns) {
  if (s.opcode == static_cast<uint8_t>(AdminOp::Fabrics)) {
    switch (static_cast<FabricsType>(s.fctype())) {
      case FabricsType::PropertyGet: return property_get(s, data);
      case FabricsType::PropertySet: return property_set(s);
      case FabricsType::Connect: return done(s, sc::kCmdSeqError);  // this queue is connected already
      default: return done(s, sc::kInvalidOpcode);
    }
  }
  if (!ready()) return done(s, sc::kCmdSeqError);
  bool disc = sub_.is_discovery();
  switch (static_cast<AdminOp>(s.opcode)) {
    case AdminOp::Identify: return identify(s, data);
    case AdminOp::GetLogPage: return get_log_page(s, data);
    case AdminOp::SetFeatures: return set_features(s, now_ns);
    case AdminOp::GetFeatures: return get_features(s, data);
    case AdminOp::AsyncEvent: return async_event(s);
    case AdminOp::KeepAlive:
      ka_deadline_ns_ = ka_deadline(now_ns, kato_ms_);
      return done(s, sc::kSuccess);
    case AdminOp::Abort:
      if (disc) break;
      // DW0 bit 0 set: the command was not aborted (it completes on its own).
      return done(s, sc::kSuccess, 1);
    default: break;
  }
  return done(s, sc::kInvalidOpcode);
}

Response Controller::property_get(const Sqe& s, std::span<uint8_t>) {
  PropertyCmd p = decode_property(s);
  switch (static_cast<Prop>(p.offset)) {
    case Prop::Cap: return p.eight_bytes ? done(s, sc::kSuccess, cap_) : done(s, sc::kInvalidField);
    case Prop::Vs: return p.eight_bytes ? done(s, sc::kInvalidField) : done(s, sc::kSuccess, make_vs(1, 3));
    case Prop::Cc: return p.eight_bytes ? done(s, sc::kInvalidField) : done(s, sc::kSuccess, cc_);
    case Prop::Csts: return p.eight_bytes ? done(s, sc::kInvalidField) : done(s, sc::kSuccess, csts_);
    case Prop::Nssr: return p.eight_bytes ? done(s, sc::kInvalidField) : done(s, sc::kSuccess, 0);
    default: return done(s, sc::kInvalidField);
  }
}

Response Controller::property_set(const Sqe& s) {
  PropertyCmd p = decode_property(s);
  if (static_cast<Prop>(p.offset) != Prop::Cc || p.eight_bytes) return done(s, sc::kInvalidField);
  uint32_t old = cc_, v = static_cast<uint32_t>(p.value);
  cc_ = v;
  if (!(old & cc::kEn) && (v & cc::kEn)) {
    // 64-byte SQEs, 16-byte CQEs, 4 KiB pages, NVM command set, round robin:
    // anything else is a fatal configuration (CSTS.CFS), as nvmet does.
    if (cc::iosqes(v) != 6 || cc::iocqes(v) != 4 || cc::mps(v) != 0 || cc::css(v) != 0 || cc::ams(v) != 0)
      csts_ |= csts::kCfs;
    else
      csts_ |= csts::kRdy;
  }
  if ((old & cc::kEn) && !(v & cc::kEn)) {
    reset();
    csts_ &= ~csts::kCfs;
  }
  if (cc::shn(v) && !cc::shn(old)) {
    reset();
    csts_ |= csts::kShstComplete;
  }
  if (!cc::shn(v) && cc::shn(old)) csts_ &= ~csts::kShstMask;
  return done(s, sc::kSuccess);
}

Response Controller::identify(const Sqe& s, std::span<uint8_t> data) {
  std::array<uint8_t, kIdentifySize> page;
  const TargetConfig& c = target_.config();
  auto cns = static_cast<Cns>(s.cdw10 & 0xff);
  bool disc = sub_.is_discovery();
  if (cns == Cns::Controller) {
    CtrlIdentity id;
    id.sn = sub_.serial();
    id.mn = sub_.model();
    id.fr = c.firmware;
    id.mdts = c.mdts;
    id.cntlid = cntlid_;
    id.oaes = disc ? 0 : kOaesNsAttrChanged;
    id.cntrltype = disc ? 2 : 1;
    id.lpa = 1u << 2;  // extended data for Get Log Page (offsets, NUMDU)
    id.kas = c.kas_100ms;
    id.maxcmd = disc ? c.admin_queue_depth : c.max_queue_depth;
    id.nn = disc ? 0 : sub_.max_nsid();
    id.oncs = disc ? 0 : (kOncsDsm | kOncsWriteZeroes);
    // A file's page cache is a volatile write cache: the host then sends Flush.
    id.vwc = !disc && sub_.has_file_namespace() ? 1 : 0;
    id.sgls = sgls::kSupported | sgls::kKeyed | (c.in_capsule_data ? sgls::kOffset : 0);
    id.subnqn = sub_.nqn();
    id.ioccsz = static_cast<uint32_t>((kSqeSize + c.in_capsule_data) / 16);
    build_identify_ctrl(page, id);
  } else if (disc) {
    return done(s, sc::kInvalidField);
  } else if (cns == Cns::Namespace) {
    if (s.nsid == 0 || s.nsid == 0xffffffffu || s.nsid > sub_.max_nsid()) return done(s, sc::kInvalidNs);
    Namespace* ns = sub_.ns(s.nsid);
    if (ns)
      build_identify_ns(page, ns->identity());
    else
      page.fill(0);  // an inactive NSID: a zero-filled structure
  } else if (cns == Cns::ActiveNsList) {
    if (s.nsid >= 0xfffffffeu) return done(s, sc::kInvalidNs);
    build_active_ns_list(page, sub_.nsids(), s.nsid);
  } else if (cns == Cns::NsDescList) {
    Namespace* ns = sub_.ns(s.nsid);
    if (!ns) return done(s, sc::kInvalidNs);
    build_ns_desc_list(page, ns->nguid(), ns->uuid());
  } else {
    return done(s, sc::kInvalidField);
  }
  size_t n = std::min(data.size(), page.size());
  if (n) std::memcpy(data.data(), page.data(), n);
  return done(s, sc::kSuccess, 0, static_cast<uint32_t>(n));
}

Response Controller::get_log_page(const Sqe& s, std::span<uint8_t> data) {
  auto lid = static_cast<LogPage>(s.cdw10 & 0xff);
  bool rae = (s.cdw10 >> 15) & 1;
  uint64_t numd = ((uint64_t{s.cdw11 & 0xffff} << 16) | (s.cdw10 >> 16)) + 1;
  uint64_t offset = s.cdw12 | (uint64_t{s.cdw13} << 32);
  if (offset & 3) return done(s, sc::kInvalidField);
  std::vector<uint8_t> log;
  bool disc = sub_.is_discovery();
  if (lid == LogPage::Discovery && disc) {
    log = target_.discovery_log(hostnqn_);
  } else if (lid == LogPage::Error) {
    log.assign(64, 0);
  } else if (!disc && (lid == LogPage::Smart || lid == LogPage::FwSlot)) {
    log.assign(512, 0);
  } else if (!disc && lid == LogPage::ChangedNs) {
    log.assign(kIdentifySize, 0);
    if (changed_ns_.size() > kIdentifySize / 4) {
      le::put32(log.data(), 0xffffffffu);
    } else {
      for (size_t i = 0; i < changed_ns_.size(); ++i) le::put32(&log[4 * i], changed_ns_[i]);
    }
    if (!rae) {
      changed_ns_.clear();
      ns_event_masked_ = false;
    }
  } else {
    return done(s, sc::kInvalidLogPage);
  }
  if (offset > log.size()) return done(s, sc::kInvalidField);
  uint64_t n = std::min<uint64_t>(numd * 4, data.size());
  uint64_t avail = std::min<uint64_t>(n, log.size() - offset);
  if (avail) std::memcpy(data.data(), log.data() + offset, avail);
  if (n > avail) std::memset(data.data() + avail, 0, n - avail);
  return done(s, sc::kSuccess, 0, static_cast<uint32_t>(n));
}

Response Controller::set_features(const Sqe& s, uint64_t now_ns) {
  auto fid = static_cast<Feature>(s.cdw10 & 0xff);
  if (s.cdw10 >> 31) return done(s, sc::kFeatureNotSaveable);
  bool disc = sub_.is_discovery();
  switch (fid) {
    case Feature::NumQueues: {
      if (disc) break;
      uint32_t nsqr = s.cdw11 & 0xffff, ncqr = s.cdw11 >> 16;
      if (nsqr == 0xffff || ncqr == 0xffff) return done(s, sc::kInvalidField);
      uint32_t max = target_.config().max_io_queues;
      uint32_t nsqa = std::min(nsqr + 1, max), ncqa = std::min(ncqr + 1, max);
      io_queues_ = static_cast<uint16_t>(std::min(nsqa, ncqa));
      io_queues_set_ = true;
      return done(s, sc::kSuccess, ((ncqa - 1) << 16) | (nsqa - 1));
    }
    case Feature::AsyncEventConfig:
      aec_ = s.cdw11;
      return done(s, sc::kSuccess);
    case Feature::KeepAlive:
      kato_ms_ = s.cdw11;
      ka_deadline_ns_ = ka_deadline(now_ns, kato_ms_);
      return done(s, sc::kSuccess);
    case Feature::HostId:
      return done(s, sc::kCmdSeqError);  // set by Connect on fabrics
    default: break;
  }
  return done(s, sc::kInvalidField);
}

Response Controller::get_features(const Sqe& s, std::span<uint8_t> data) {
  auto fid = static_cast<Feature>(s.cdw10 & 0xff);
  bool disc = sub_.is_discovery();
  switch (fid) {
    case Feature::NumQueues: {
      if (disc) break;
      uint32_t n = io_queues_ ? io_queues_ - 1u : 0;
      return done(s, sc::kSuccess, (n << 16) | n);
    }
    case Feature::AsyncEventConfig: return done(s, sc::kSuccess, aec_);
    case Feature::KeepAlive: return done(s, sc::kSuccess, kato_ms_);
    case Feature::HostId: {
      if (!(s.cdw11 & 1)) return done(s, sc::kInvalidField);  // fabrics: 128-bit host ID only
      size_t n = std::min<size_t>(data.size(), 16);
      if (n) std::memcpy(data.data(), hostid_.data(), n);
      return done(s, sc::kSuccess, 0, static_cast<uint32_t>(n));
    }
    case Feature::Arbitration:
    case Feature::PowerMgmt:
    case Feature::TempThreshold:
    case Feature::ErrorRecovery:
    case Feature::VolatileWc:
    case Feature::WriteAtomic:
      if (disc) break;
      return done(s, sc::kSuccess, 0);
    default: break;
  }
  return done(s, sc::kInvalidField);
}

Response Controller::async_event(const Sqe& s) {
  if (aer_cids_.size() >= 4) return done(s, sc::kAsyncLimit);  // AERL 3: four outstanding
  aer_cids_.push_back(s.cid);
  deliver_events();
  Response r;
  r.cqe.cid = s.cid;
  r.deferred = true;
  return r;
}

void Controller::notify_ns_changed(uint32_t nsid) {
  if (changed_ns_.size() <= kIdentifySize / 4 &&
      std::find(changed_ns_.begin(), changed_ns_.end(), nsid) == changed_ns_.end())
    changed_ns_.push_back(nsid);
  if (!(aec_ & kAecNsAttr) || ns_event_masked_) return;
  ns_event_masked_ = true;  // until the host reads the Changed Namespace List
  events_.push_back(kAenNsChanged);
  deliver_events();
}

void Controller::deliver_events() {
  while (!aer_cids_.empty() && !events_.empty()) {
    Cqe c;
    c.cid = aer_cids_.front();
    c.result = events_.front();
    aer_cids_.pop_front();
    events_.pop_front();
    async_out_.push_back(c);
  }
}

bool Controller::take_async(Cqe& out) {
  if (async_out_.empty()) return false;
  out = async_out_.front();
  async_out_.pop_front();
  return true;
}

Response Controller::execute_io(const Sqe& s, std::span<uint8_t> data) noexcept {
  if (sub_.is_discovery()) return done(s, sc::kInvalidOpcode);
  if (!ready()) return done(s, sc::kCmdSeqError);
  auto op = static_cast<IoOp>(s.opcode);
  if (op == IoOp::Flush && s.nsid == 0xffffffffu) return done(s, sc::kSuccess);
  Namespace* ns = sub_.ns(s.nsid);
  if (!ns) return done(s, sc::kInvalidNs);
  uint64_t slba = s.cdw10 | (uint64_t{s.cdw11} << 32);
  uint64_t nlb = (s.cdw12 & 0xffff) + 1ull;
  if (ns->is_file()) return file_io(s, *ns, data, slba, nlb);
  switch (op) {
    case IoOp::Read:
    case IoOp::Write: {
      if (!ns->in_range(slba, nlb)) return done(s, sc::kLbaRange);
      uint64_t bytes = nlb << ns->lba_shift();
      if (bytes != data.size()) return done(s, sc::kSglInvalidData);
      if (op == IoOp::Read) {
        ns->read(slba, data);
        return done(s, sc::kSuccess, 0, static_cast<uint32_t>(bytes));
      }
      ns->write(slba, data);
      return done(s, sc::kSuccess);
    }
    case IoOp::WriteZeroes:
      if (!ns->in_range(slba, nlb)) return done(s, sc::kLbaRange);
      ns->zero(slba, nlb);
      return done(s, sc::kSuccess);
    case IoOp::Flush:
      return done(s, sc::kSuccess);  // RAM: nothing volatile to flush
    case IoOp::DatasetMgmt: {
      size_t nr = (s.cdw10 & 0xff) + 1;
      if (data.size() < nr * 16) return done(s, sc::kSglInvalidData);
      // Ranges: context attributes le32, length in blocks le32, SLBA le64.
      for (size_t i = 0; i < nr; ++i)
        if (!ns->in_range(le::get64(&data[16 * i + 8]), le::get32(&data[16 * i + 4]))) return done(s, sc::kLbaRange);
      if (s.cdw11 & (1u << 2))  // AD: deallocate; the blocks read zeroes after (DLFEAT)
        for (size_t i = 0; i < nr; ++i) ns->zero(le::get64(&data[16 * i + 8]), le::get32(&data[16 * i + 4]));
      return done(s, sc::kSuccess);
    }
    default: break;
  }
  return done(s, sc::kInvalidOpcode);
}

Response Controller::file_io(const Sqe& s, Namespace& ns, std::span<uint8_t> data, uint64_t slba, uint64_t nlb) noexcept {
  auto op = static_cast<IoOp>(s.opcode);
  Response r = done(s, sc::kSuccess);
  r.ns = &ns;
  bool writes = op == IoOp::Write || op == IoOp::WriteZeroes || (op == IoOp::DatasetMgmt && (s.cdw11 & (1u << 2)));
  if (writes && ns.read_only()) return done(s, sc::kNsWriteProtected);
  switch (op) {
    case IoOp::Read:
    case IoOp::Write:
      if (!ns.in_range(slba, nlb)) return done(s, sc::kLbaRange);
      if ((nlb << ns.lba_shift()) != data.size()) return done(s, sc::kSglInvalidData);
      r.file = FileOp{op == IoOp::Read ? FileOp::Read : FileOp::Write, slba << ns.lba_shift(), nlb << ns.lba_shift(), 0};
      break;
    case IoOp::WriteZeroes:
      if (!ns.in_range(slba, nlb)) return done(s, sc::kLbaRange);
      r.file = FileOp{FileOp::WriteZeroes, slba << ns.lba_shift(), nlb << ns.lba_shift(), 0};
      break;
    case IoOp::Flush:
      r.file = FileOp{FileOp::Flush, 0, 0, 0};
      break;
    case IoOp::DatasetMgmt: {
      uint32_t nr = (s.cdw10 & 0xff) + 1;
      if (data.size() < size_t{nr} * 16) return done(s, sc::kSglInvalidData);
      for (size_t i = 0; i < nr; ++i)
        if (!ns.in_range(le::get64(&data[16 * i + 8]), le::get32(&data[16 * i + 4]))) return done(s, sc::kLbaRange);
      if (!(s.cdw11 & (1u << 2))) return done(s, sc::kSuccess);  // only attributes: nothing to do
      r.file = FileOp{FileOp::Deallocate, 0, 0, nr};
      break;
    }
    default: return done(s, sc::kInvalidOpcode);
  }
  r.pending = true;
  return r;
}

// ------------------------------------------------------------------- Target

bool Target::has_file_namespace() const noexcept {
  return std::any_of(subs_.begin(), subs_.end(), [](const auto& s) { return s->has_file_namespace(); });
}

Target::Target(TargetConfig c) : cfg_(std::move(c)) {
  if (cfg_.max_queue_depth < 2 || cfg_.max_queue_depth > kMaxQueueSize)
    throw std::invalid_argument("nvmf max_queue_depth: must be 2.." + std::to_string(kMaxQueueSize));
  if (cfg_.admin_queue_depth < 2 || cfg_.admin_queue_depth > cfg_.max_queue_depth)
    throw std::invalid_argument("nvmf admin_queue_depth: must be 2..max_queue_depth");
  if (cfg_.max_io_queues == 0 || cfg_.max_io_queues > 0xfffe) throw std::invalid_argument("nvmf max_io_queues: must be 1..65534");
  if (cfg_.in_capsule_data % 16) throw std::invalid_argument("nvmf in_capsule_data: must be a multiple of 16");
  if (cfg_.mdts > 12) throw std::invalid_argument("nvmf mdts: at most 12 (16 MiB)");
  auto d = std::make_unique<Subsystem>(kDiscoveryNqn, "", "droce-nvmf discovery", true);
  d->discovery_ = true;
  subs_.push_back(std::move(d));
}

Subsystem& Target::add_subsystem(std::string nqn, std::string serial, bool allow_any_host, std::string model) {
  if (subsystem(nqn)) throw std::invalid_argument("subsystem nqn: duplicate '" + nqn + "'");
  subs_.push_back(std::make_unique<Subsystem>(std::move(nqn), std::move(serial), model.empty() ? cfg_.model : std::move(model),
                                              allow_any_host));
  ++genctr_;
  return *subs_.back();
}

Subsystem* Target::subsystem(std::string_view nqn) noexcept {
  for (auto& s : subs_)
    if (s->nqn() == nqn) return s.get();
  return nullptr;
}

Controller* Target::controller(uint16_t cntlid) noexcept {
  std::lock_guard lk(mu_);
  auto it = ctrls_.find(cntlid);
  return it == ctrls_.end() ? nullptr : it->second.get();
}

void Target::destroy(uint16_t cntlid) noexcept {
  std::lock_guard lk(mu_);
  auto it = ctrls_.find(cntlid);
  if (it == ctrls_.end()) return;
  it->second->gone_.store(true, std::memory_order_release);
  ctrls_.erase(it);
}

Target::Connected Target::connect(const Sqe& s, std::span<const uint8_t> data, uint16_t cm_qid, uint64_t now_ns) {
  std::lock_guard lk(mu_);
  Connected out;
  out.cqe.cid = s.cid;
  auto fail = [&](Status st, uint32_t result = 0) {
    out.cqe.status = st;
    out.cqe.result = result;
    return out;
  };
  ConnectCmd c = decode_connect(s);
  if (c.recfmt != 0) return fail(sc::kConnectFormat);
  if (data.size() < kConnectDataSize) return fail(sc::kSglInvalidData);
  ConnectData d;
  if (!decode_connect_data(data, d))
    return fail(sc::kConnectInvalidParam, connect_invalid_param(true, kConnectDataOffSubnqn));
  if (c.qid != cm_qid) return fail(sc::kConnectInvalidParam, connect_invalid_param(false, kConnectOffQid));
  Subsystem* sub = subsystem(d.subnqn);
  if (!sub) return fail(sc::kConnectInvalidParam, connect_invalid_param(true, kConnectDataOffSubnqn));
  if (!sub->host_allowed(d.hostnqn))
    return fail(sc::kConnectInvalidHost, connect_invalid_param(true, kConnectDataOffHostnqn));
  if (c.qid == 0) {
    if (d.cntlid != kCntlidDynamic) return fail(sc::kConnectInvalidParam, connect_invalid_param(true, kConnectDataOffCntlid));
    if (c.sqsize == 0 || c.sqsize >= cfg_.admin_queue_depth)
      return fail(sc::kConnectInvalidParam, connect_invalid_param(false, kConnectOffSqsize));
    uint16_t id = 0;
    for (uint32_t i = 0; i < kCntlidMax; ++i) {
      uint16_t cand = next_cntlid_;
      next_cntlid_ = next_cntlid_ >= kCntlidMax ? kCntlidMin : static_cast<uint16_t>(next_cntlid_ + 1);
      if (!ctrls_.count(cand)) {
        id = cand;
        break;
      }
    }
    if (!id) return fail(sc::kConnectCtrlBusy);
    auto ctrl = std::make_shared<Controller>(*this, *sub, id, d, c.kato_ms, now_ns);
    out.ctrl = ctrl.get();
    out.ref = ctrl;
    ctrls_.emplace(id, std::move(ctrl));
    out.cqe.result = id;
    return out;
  }
  if (sub->is_discovery()) return fail(sc::kConnectInvalidParam, connect_invalid_param(false, kConnectOffQid));
  auto cit = ctrls_.find(d.cntlid);
  Controller* ctrl = cit == ctrls_.end() ? nullptr : cit->second.get();
  if (!ctrl || &ctrl->subsystem() != sub || ctrl->hostnqn() != d.hostnqn)
    return fail(sc::kConnectInvalidParam, connect_invalid_param(true, kConnectDataOffCntlid));
  if (!ctrl->ready() || ctrl->ka_expired_) return fail(sc::kCmdSeqError);  // expired: being torn down
  if (c.qid > ctrl->io_queues()) return fail(sc::kConnectInvalidParam, connect_invalid_param(false, kConnectOffQid));
  if (c.sqsize == 0 || c.sqsize >= cfg_.max_queue_depth)
    return fail(sc::kConnectInvalidParam, connect_invalid_param(false, kConnectOffSqsize));
  if (ctrl->io_queue_connected(c.qid)) return fail(sc::kCmdSeqError);
  ctrl->ioq_[c.qid] = true;
  out.ctrl = ctrl;
  out.ref = cit->second;
  out.cqe.result = ctrl->cntlid();
  return out;
}

std::vector<uint8_t> Target::discovery_log(std::string_view hostnqn) const {
  std::vector<DiscEntry> es;
  for (auto& s : subs_) {
    if (s->is_discovery() || !s->host_allowed(hostnqn)) continue;
    DiscEntry e;
    e.adrfam = cfg_.ipv6 ? disc::kAdrfamIpv6 : disc::kAdrfamIpv4;
    e.portid = cfg_.portid;
    e.asqsz = cfg_.admin_queue_depth;
    e.trsvcid = std::to_string(cfg_.port);
    e.subnqn = s->nqn();
    e.traddr = cfg_.traddr;
    es.push_back(std::move(e));
  }
  return build_discovery_log(genctr_, es);
}

std::vector<uint16_t> Target::expired(uint64_t now_ns) {
  std::lock_guard lk(mu_);
  std::vector<uint16_t> v;
  for (auto& [id, c] : ctrls_)
    if (!c->ka_expired_ && !c->alive(now_ns)) {
      c->ka_expired_ = true;
      v.push_back(id);
    }
  return v;
}

}  // namespace droce::nvmf
