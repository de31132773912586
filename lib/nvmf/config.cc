#include "nvmf/config.h"

#include <arpa/inet.h>

#include <set>
#include <toml++/toml.h>

namespace droce::nvmf {

namespace {

[[noreturn]] void fail(const std::string& src, const std::string& key, const std::string& msg, const toml::node* at) {
  std::string m = "nvmf config: " + key + ": " + msg;
  if (at && at->source().begin.line) m += " (" + src + " line " + std::to_string(at->source().begin.line) + ")";
  throw NvmfConfigError(m);
}

// The keys of one table; finish() rejects the ones nobody read.
class Keys {
 public:
  Keys(const std::string& src, const toml::table& t, std::string path) : src_(src), t_(t), path_(std::move(path)) {}
  std::string key(std::string_view k) const { return path_ + "." + std::string(k); }
  [[noreturn]] void fail_key(std::string_view k, const std::string& msg) const { fail(src_, key(k), msg, t_.get(k)); }
  const toml::node* get(std::string_view k) {
    seen_.insert(std::string(k));
    return t_.get(k);
  }
  template <class T>
  void integer(std::string_view k, T& out, int64_t lo, int64_t hi) {
    const toml::node* n = get(k);
    if (!n) return;
    if (!n->is_integer()) fail_key(k, "expected an integer");
    int64_t v = n->as_integer()->get();
    if (v < lo || v > hi) fail_key(k, std::to_string(v) + " is out of range " + std::to_string(lo) + ".." + std::to_string(hi));
    out = static_cast<T>(v);
  }
  bool string(std::string_view k, std::string& out) {
    const toml::node* n = get(k);
    if (!n) return false;
    if (!n->is_string()) fail_key(k, "expected a string");
    out = n->as_string()->get();
    return true;
  }
  void boolean(std::string_view k, bool& out) {
    const toml::node* n = get(k);
    if (!n) return;
    if (!n->is_boolean()) fail_key(k, "expected a boolean");
    out = n->as_boolean()->get();
  }
  std::vector<std::string> strings(std::string_view k) {
    std::vector<std::string> v;
    const toml::node* n = get(k);
    if (!n) return v;
    if (!n->is_array()) fail_key(k, "expected an array of strings");
    for (const toml::node& e : *n->as_array()) {
      if (!e.is_string()) fail_key(k, "expected an array of strings");
      v.push_back(e.as_string()->get());
    }
    return v;
  }
  // An array of tables ([[k]]).
  const toml::array* tables(std::string_view k) {
    const toml::node* n = get(k);
    if (!n) return nullptr;
    if (!n->is_array_of_tables()) fail_key(k, "expected an array of tables ([[" + key(k) + "]])");
    return n->as_array();
  }
  void finish() const {
    for (auto&& [k, v] : t_)
      if (!seen_.count(std::string(k.str()))) fail(src_, key(k.str()), "unknown key", &v);
  }

 private:
  const std::string& src_;
  const toml::table& t_;
  std::string path_;
  std::set<std::string> seen_;
};

bool hexval(char c, uint8_t& v) {
  if (c >= '0' && c <= '9') v = static_cast<uint8_t>(c - '0');
  else if (c >= 'a' && c <= 'f') v = static_cast<uint8_t>(c - 'a' + 10);
  else if (c >= 'A' && c <= 'F') v = static_cast<uint8_t>(c - 'A' + 10);
  else return false;
  return true;
}

bool printable(std::string_view s) {
  for (char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

NamespaceSpec parse_namespace(const std::string& src, const toml::table& t, const std::string& path) {
  Keys k(src, t, path);
  NamespaceSpec n;
  if (!k.get("nsid")) k.fail_key("nsid", "missing");
  k.integer("nsid", n.ns.nsid, 1, 0xfffffffe);
  k.integer("block_size", n.ns.block_size, 512, 4096);
  if (n.ns.block_size != 512 && n.ns.block_size != 4096)
    k.fail_key("block_size", std::to_string(n.ns.block_size) + " is not 512 or 4096");
  k.string("backend", n.backend);
  if (n.backend != "ram" && n.backend != "file") k.fail_key("backend", "\"" + n.backend + "\" is not \"ram\" or \"file\"");
  bool has_path = k.string("path", n.path);
  if (n.backend == "file" && (!has_path || n.path.empty())) k.fail_key("path", "missing (backend \"file\")");
  if (n.backend == "ram" && has_path) k.fail_key("path", "only for backend \"file\"");
  if (const toml::node* s = k.get("size")) {
    bool ok = false;
    if (s->is_integer() && s->as_integer()->get() > 0) {
      n.ns.size_bytes = static_cast<uint64_t>(s->as_integer()->get());
      ok = true;
    } else if (s->is_string()) {
      ok = parse_size(s->as_string()->get(), n.ns.size_bytes) && n.ns.size_bytes > 0;
    }
    if (!ok) k.fail_key("size", "expected a positive size (bytes, or a string like \"512MiB\")");
    if (n.ns.size_bytes % n.ns.block_size)
      k.fail_key("size", std::to_string(n.ns.size_bytes) + " is not a multiple of block_size " + std::to_string(n.ns.block_size));
  } else if (n.backend == "ram") {
    k.fail_key("size", "missing (backend \"ram\")");
  }
  std::string u;
  if (k.string("uuid", u) && !parse_uuid(u, n.ns.uuid)) k.fail_key("uuid", "\"" + u + "\" is not a UUID");
  k.finish();
  return n;
}

SubsystemSpec parse_subsystem(const std::string& src, const toml::table& t, const std::string& path) {
  Keys k(src, t, path);
  SubsystemSpec s;
  if (!k.string("nqn", s.nqn)) k.fail_key("nqn", "missing");
  if (!valid_nqn(s.nqn) || s.nqn == kDiscoveryNqn) k.fail_key("nqn", "\"" + s.nqn + "\" is not an NQN (nqn.yyyy-mm.domain[:name], at most 223 bytes)");
  k.string("serial", s.serial);
  if (s.serial.size() > 20 || !printable(s.serial)) k.fail_key("serial", "at most 20 printable ASCII characters");
  k.string("model", s.model);
  if (s.model.size() > 40 || !printable(s.model)) k.fail_key("model", "at most 40 printable ASCII characters");
  k.boolean("allow_any_host", s.allow_any_host);
  s.hosts = k.strings("hosts");
  for (auto& h : s.hosts)
    if (!valid_nqn(h)) k.fail_key("hosts", "\"" + h + "\" is not an NQN");
  if (!s.allow_any_host && s.hosts.empty()) k.fail_key("hosts", "empty and allow_any_host is false: no host could connect");
  if (const toml::array* a = k.tables("namespace")) {
    std::set<uint32_t> ids;
    for (size_t i = 0; i < a->size(); ++i) {
      std::string p = path + ".namespace[" + std::to_string(i) + "]";
      s.namespaces.push_back(parse_namespace(src, *(*a)[i].as_table(), p));
      if (!ids.insert(s.namespaces.back().ns.nsid).second)
        fail(src, p + ".nsid", std::to_string(s.namespaces.back().ns.nsid) + " is a duplicate", (*a)[i].as_table()->get("nsid"));
    }
  }
  k.finish();
  return s;
}

}  // namespace

bool parse_size(std::string_view s, uint64_t& bytes) noexcept {
  size_t i = 0;
  uint64_t v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    if (v > (~0ull - 9) / 10) return false;
    v = v * 10 + static_cast<uint64_t>(s[i] - '0');
    ++i;
  }
  if (i == 0) return false;
  std::string_view unit = s.substr(i);
  unsigned shift = 0;
  if (unit.empty()) shift = 0;
  else if (unit == "KiB") shift = 10;
  else if (unit == "MiB") shift = 20;
  else if (unit == "GiB") shift = 30;
  else if (unit == "TiB") shift = 40;
  else return false;
  if (shift && v > (~0ull >> shift)) return false;
  bytes = v << shift;
  return true;
}

bool parse_uuid(std::string_view s, std::array<uint8_t, 16>& out) noexcept {
  if (s.size() != 36) return false;
  size_t o = 0;
  for (size_t i = 0; i < 36;) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (s[i] != '-') return false;
      ++i;
      continue;
    }
    uint8_t hi, lo;
    if (i + 1 >= 36 || !hexval(s[i], hi) || !hexval(s[i + 1], lo)) return false;
    out[o++] = static_cast<uint8_t>(hi << 4 | lo);
    i += 2;
  }
  return o == 16;
}

NvmfConfig parse_nvmf_config(std::string_view text, std::string_view source,
                             const std::vector<std::string>& default_listen) {
  std::string src(source);
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw NvmfConfigError("nvmf config: " + src + " line " + std::to_string(e.source().begin.line) + ": " +
                          std::string(e.description()));
  }
  const toml::node* sec = root.get("nvmf");
  if (!sec) throw NvmfConfigError("nvmf config: nvmf: missing section [nvmf] in " + src);
  if (!sec->is_table()) fail(src, "nvmf", "expected a table", sec);
  Keys k(src, *sec->as_table(), "nvmf");
  NvmfConfig c;
  TargetConfig& t = c.target;
  c.listen = k.strings("listen");
  if (c.listen.empty() && !sec->as_table()->contains("listen")) c.listen = default_listen;
  if (c.listen.empty()) k.fail_key("listen", "missing or empty: the addresses to listen on");
  for (auto& a : c.listen) {
    uint8_t buf[16];
    if (inet_pton(AF_INET, a.c_str(), buf) != 1 && inet_pton(AF_INET6, a.c_str(), buf) != 1)
      k.fail_key("listen", "\"" + a + "\" is not an IPv4 or IPv6 address");
  }
  t.traddr = c.listen[0];
  t.ipv6 = c.listen[0].find(':') != std::string::npos;
  k.integer("port", t.port, 1, 65535);
  k.integer("cores", c.cores, 1, 16);  // engine::Embedded: 1..16 queues
  k.integer("max_queue_depth", t.max_queue_depth, 2, kMaxQueueSize);
  k.integer("max_io_queues", t.max_io_queues, 1, 1024);
  k.integer("in_capsule_data", t.in_capsule_data, 0, 65536);
  if (t.in_capsule_data % 16) k.fail_key("in_capsule_data", std::to_string(t.in_capsule_data) + " is not a multiple of 16");
  k.integer("mdts", t.mdts, 1, 12);
  uint32_t kas_ms = 100;
  k.integer("keep_alive_granularity_ms", kas_ms, 100, 6553500);
  if (kas_ms % 100) k.fail_key("keep_alive_granularity_ms", std::to_string(kas_ms) + " is not a multiple of 100");
  t.kas_100ms = static_cast<uint16_t>(kas_ms / 100);
  k.string("model", t.model);
  if (t.model.empty() || t.model.size() > 40 || !printable(t.model)) k.fail_key("model", "1 to 40 printable ASCII characters");
  if (const toml::array* a = k.tables("subsystem")) {
    std::set<std::string> nqns;
    for (size_t i = 0; i < a->size(); ++i) {
      std::string p = "nvmf.subsystem[" + std::to_string(i) + "]";
      c.subsystems.push_back(parse_subsystem(src, *(*a)[i].as_table(), p));
      if (!nqns.insert(c.subsystems.back().nqn).second)
        fail(src, p + ".nqn", "\"" + c.subsystems.back().nqn + "\" is a duplicate", (*a)[i].as_table()->get("nqn"));
    }
  }
  k.finish();
  return c;
}

void build_target(const NvmfConfig& c, Target& t) {
  for (size_t i = 0; i < c.subsystems.size(); ++i) {
    const SubsystemSpec& s = c.subsystems[i];
    Subsystem& sub = t.add_subsystem(s.nqn, s.serial, s.allow_any_host, s.model);
    for (auto& h : s.hosts) sub.allow_host(h);
    for (size_t j = 0; j < s.namespaces.size(); ++j) {
      const NamespaceSpec& n = s.namespaces[j];
      if (n.backend == "ram") {
        sub.add_namespace(Namespace::ram(n.ns, s.nqn));
        continue;
      }
      std::unique_ptr<Namespace> ns;
      try {
        ns = Namespace::file(n.ns, s.nqn, n.path);
      } catch (const std::exception& e) {
        throw NvmfConfigError("nvmf config: nvmf.subsystem[" + std::to_string(i) + "].namespace[" + std::to_string(j) +
                              "].path: " + e.what());
      }
      sub.add_namespace(std::move(ns));
    }
  }
}

}  // namespace droce::nvmf
