// droce/config: TOML -> Config, with every key checked (see config.h).
#include "config/config.h"

#include <arpa/inet.h>
#include <grp.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <toml++/toml.h>

namespace droce::config {
namespace {

constexpr uint32_t kMaxLcore = 127;  // RTE_MAX_LCORE - 1 in Debian's DPDK 22.11
constexpr uint32_t kMaxQueues = 64;

const char* type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::none: return "nothing";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
  }
  return "an unknown type";
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Shared by every Reader of one parse: where messages point to.
struct Source {
  std::string name;
};

[[noreturn]] void fail(const Source& src, const std::string& key, const std::string& msg,
                       const toml::node* where = nullptr) {
  std::string m = "config: " + key + ": " + msg;
  if (where != nullptr && where->source().begin.line != 0) {
    m += " (" + src.name + " line " + std::to_string(where->source().begin.line) + ")";
  }
  throw ConfigError(m);
}

// Reads the keys of one table; remembers which it consumed so finish() can
// reject the rest as unknown.
class Reader {
 public:
  Reader(const Source& src, const toml::table& t, std::string path)
      : src_(src), t_(t), path_(std::move(path)) {}

  std::string key_path(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  [[noreturn]] void fail_key(std::string_view key, const std::string& msg) const {
    fail(src_, key_path(key), msg, t_.get(key));
  }

  const toml::node* node(std::string_view key) {
    known_.insert(std::string(key));
    return t_.get(key);
  }

  const toml::node* typed(std::string_view key, toml::node_type want) {
    const toml::node* n = node(key);
    if (n != nullptr && n->type() != want) {
      fail_key(key, std::string("expected ") + type_name(want) + ", got " + type_name(n->type()));
    }
    return n;
  }

  std::optional<int64_t> integer(std::string_view key, int64_t lo, int64_t hi) {
    const toml::node* n = typed(key, toml::node_type::integer);
    if (n == nullptr) return std::nullopt;
    int64_t v = n->as_integer()->get();
    if (v < lo || v > hi) {
      fail_key(key, std::to_string(v) + " is out of range " + std::to_string(lo) + ".." +
                        std::to_string(hi));
    }
    return v;
  }

  template <class T>
  void integer_into(std::string_view key, T& out, int64_t lo, int64_t hi) {
    if (auto v = integer(key, lo, hi)) out = static_cast<T>(*v);
  }

  // A probability: an integer 0/1 or a float in [0, 1].
  void probability_into(std::string_view key, double& out) {
    const toml::node* n = node(key);
    if (n == nullptr) return;
    double v = 0;
    if (n->is_integer()) {
      v = static_cast<double>(n->as_integer()->get());
    } else if (n->is_floating_point()) {
      v = n->as_floating_point()->get();
    } else {
      fail_key(key, std::string("expected a number, got ") + type_name(n->type()));
    }
    if (!(v >= 0.0 && v <= 1.0)) {  // also rejects nan
      std::ostringstream os;
      os << v << " is out of range 0..1";
      fail_key(key, os.str());
    }
    out = v;
  }

  void boolean_into(std::string_view key, bool& out) {
    if (const toml::node* n = typed(key, toml::node_type::boolean)) out = n->as_boolean()->get();
  }

  std::optional<std::string> string(std::string_view key) {
    const toml::node* n = typed(key, toml::node_type::string);
    if (n == nullptr) return std::nullopt;
    return n->as_string()->get();
  }

  void string_into(std::string_view key, std::string& out) {
    if (auto s = string(key)) out = *s;
  }

  std::string required_string(std::string_view key) {
    auto s = string(key);
    if (!s) fail(src_, key_path(key), "is required", &t_);
    if (s->empty()) fail_key(key, "must not be empty");
    return *s;
  }

  // An array whose elements are all strings.
  std::optional<std::vector<std::string>> strings(std::string_view key) {
    const toml::node* n = typed(key, toml::node_type::array);
    if (n == nullptr) return std::nullopt;
    std::vector<std::string> out;
    size_t i = 0;
    for (const toml::node& e : *n->as_array()) {
      if (!e.is_string()) {
        fail(src_, key_path(key) + "[" + std::to_string(i) + "]",
             std::string("expected a string, got ") + type_name(e.type()), &e);
      }
      out.push_back(e.as_string()->get());
      ++i;
    }
    return out;
  }

  const toml::table* table(std::string_view key) {
    const toml::node* n = typed(key, toml::node_type::table);
    return n == nullptr ? nullptr : n->as_table();
  }

  // [[key]]: an array of tables.
  const toml::array* table_array(std::string_view key) {
    const toml::node* n = node(key);
    if (n == nullptr) return nullptr;
    const toml::array* a = n->as_array();
    if (a == nullptr || !a->is_array_of_tables()) {
      fail_key(key, std::string("expected an array of tables ([[") + std::string(key) + "]]), got " +
                        (a == nullptr ? type_name(n->type()) : "an array of other values"));
    }
    return a;
  }

  void finish() const {
    for (const auto& [k, v] : t_) {
      if (known_.count(std::string(k.str())) != 0) continue;
      std::string list;
      for (const auto& s : known_) list += (list.empty() ? "" : ", ") + s;
      fail(src_, key_path(k.str()), "unknown key (known keys here: " + list + ")", &v);
    }
  }

  const std::string& path() const { return path_; }
  const Source& src() const { return src_; }

 private:
  const Source& src_;
  const toml::table& t_;
  std::string path_;
  std::set<std::string> known_;
};

bool parse_mac(std::string_view s, std::array<uint8_t, 6>& out) {
  if (s.size() != 17) return false;
  for (size_t i = 0; i < 6; ++i) {
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    int h = hex(s[i * 3]), l = hex(s[i * 3 + 1]);
    if (h < 0 || l < 0) return false;
    if (i < 5 && s[i * 3 + 2] != ':') return false;
    out[i] = static_cast<uint8_t>(h * 16 + l);
  }
  return true;
}

// "addr/len" or "addr" (host prefix). Returns an error text, empty when fine.
template <size_t N>
std::string parse_prefix(const std::string& s, int family, std::array<uint8_t, N>& addr,
                         uint8_t& prefix) {
  const uint32_t max_len = N * 8;
  std::string a = s;
  prefix = static_cast<uint8_t>(max_len);
  if (auto slash = s.find('/'); slash != std::string::npos) {
    a = s.substr(0, slash);
    std::string p = s.substr(slash + 1);
    if (p.empty() || p.size() > 3 || !std::all_of(p.begin(), p.end(), ::isdigit)) {
      return "bad prefix length in " + quote(s);
    }
    unsigned len = static_cast<unsigned>(std::stoul(p));
    if (len < 1 || len > max_len) {
      return "prefix length " + p + " is out of range 1.." + std::to_string(max_len);
    }
    prefix = static_cast<uint8_t>(len);
  }
  if (inet_pton(family, a.c_str(), addr.data()) != 1) {
    return quote(s) + std::string(" is not an ") + (family == AF_INET ? "IPv4" : "IPv6") +
           " address (want " + (family == AF_INET ? "\"10.0.0.1/24\")" : "\"fd00::1/64\")");
  }
  return {};
}

void read_bottleneck(Reader& r, fault::Bottleneck& b, bool tx) {
  if (const toml::node* n = r.node("rate_gbps")) {
    double v = n->is_integer() ? static_cast<double>(n->as_integer()->get())
               : n->is_floating_point() ? n->as_floating_point()->get()
                                        : -1;
    if (!n->is_integer() && !n->is_floating_point())
      r.fail_key("rate_gbps", std::string("expected a number, got ") + type_name(n->type()));
    if (!(v >= 0.001 && v <= 1600)) {
      std::ostringstream os;
      os << v << " is out of range 0.001..1600";
      r.fail_key("rate_gbps", os.str());
    }
    b.rate_bps = static_cast<uint64_t>(v * 1e9);
  }
  r.integer_into("rate_pps", b.rate_pps, 1, 1'000'000'000);
  if (b.rate_bps != 0 && b.rate_pps != 0) r.fail_key("rate_pps", "is set with rate_gbps; set one drain rate");
  r.integer_into("kmin_bytes", b.kmin_bytes, 0, 1ll << 32);
  r.integer_into("kmax_bytes", b.kmax_bytes, 1, 1ll << 32);
  r.probability_into("pmax", b.pmax);
  r.integer_into("limit_bytes", b.limit_bytes, 64, 1ll << 32);
  r.boolean_into("ecn", b.ecn);
  r.boolean_into("mark_dequeue", b.mark_dequeue);
  r.integer_into("pfc_xoff_bytes", b.pfc_xoff_bytes, 4096, 1ll << 32);
  const bool have_xon = r.node("pfc_xon_bytes") != nullptr;
  r.integer_into("pfc_xon_bytes", b.pfc_xon_bytes, 0, 1ll << 32);
  if (b.pfc()) {
    if (!tx) r.fail_key("pfc_xoff_bytes", "PFC pauses this port's own sender: set it on the tx bottleneck");
    if (!have_xon) b.pfc_xon_bytes = b.pfc_xoff_bytes / 2;
  } else if (have_xon) {
    r.fail_key("pfc_xon_bytes", "is set without pfc_xoff_bytes");
  }
  if (!b.active()) fail(r.src(), r.path(), "a bottleneck needs a drain rate (rate_gbps or rate_pps)");
  if (const auto e = fault::bottleneck_check(b); e.key != nullptr)
    r.fail_key(e.key, std::to_string(e.value) + " " + e.what + " (" + std::to_string(e.bound) + ")");
  r.finish();
}

void read_fault_rates(Reader& r, FaultRates& out, bool tx) {
  r.probability_into("drop", out.drop);
  r.probability_into("duplicate", out.duplicate);
  r.probability_into("reorder", out.reorder);
  r.probability_into("corrupt", out.corrupt);
  if (const toml::table* t = r.table("bottleneck")) {
    Reader br(r.src(), *t, r.key_path("bottleneck"));
    read_bottleneck(br, out.bottleneck, tx);
  }
  r.finish();
}

void read_fault(Reader& r, FaultConfig& f) {
  if (auto s = r.integer("seed", 0, INT64_MAX)) f.seed = static_cast<uint64_t>(*s);
  if (const toml::table* t = r.table("rx")) {
    Reader rr(r.src(), *t, r.key_path("rx"));
    read_fault_rates(rr, f.rx, false);
  }
  if (const toml::table* t = r.table("tx")) {
    Reader rr(r.src(), *t, r.key_path("tx"));
    read_fault_rates(rr, f.tx, true);
  }
  r.finish();
}

void read_dcqcn_params(Reader& r, DcqcnConfig& d) {
  for (const DcqcnKey& k : dcqcn_keys()) {
    if (auto v = r.integer(k.name, INT64_MIN, INT64_MAX)) {
      std::string err = set_dcqcn_key(d, k.name, *v);
      if (!err.empty()) r.fail_key(k.name, err.substr(err.find(": ") + 2));
    }
  }
  r.finish();
  std::string err = check_dcqcn(d);
  if (!err.empty()) fail(r.src(), r.path(), err);
}

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 32) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

PortConfig read_port(Reader& r) {
  PortConfig p;
  p.name = r.required_string("name");
  if (!valid_name(p.name)) {
    r.fail_key("name", quote(p.name) + " is not a valid port name (1..32 of [A-Za-z0-9_-])");
  }
  p.device = r.required_string("device");
  r.integer_into("rx_queues", p.rx_queues, 1, kMaxQueues);
  r.integer_into("tx_queues", p.tx_queues, 1, kMaxQueues);
  r.integer_into("mtu", p.mtu, 256, 9000);
  if (auto m = r.string("mac")) {
    std::array<uint8_t, 6> mac{};
    if (!parse_mac(*m, mac)) r.fail_key("mac", quote(*m) + " is not a MAC address (want \"02:00:00:00:00:01\")");
    if ((mac[0] & 1) != 0) r.fail_key("mac", quote(*m) + " is a multicast address");
    if (std::all_of(mac.begin(), mac.end(), [](uint8_t b) { return b == 0; })) {
      r.fail_key("mac", quote(*m) + " is the zero address");
    }
    p.mac = mac;
  }
  if (auto v = r.strings("ipv4")) {
    for (size_t i = 0; i < v->size(); ++i) {
      Ipv4Prefix a;
      std::string err = parse_prefix((*v)[i], AF_INET, a.addr, a.prefix);
      if (!err.empty()) r.fail_key("ipv4[" + std::to_string(i) + "]", err);
      p.ipv4.push_back(a);
    }
  }
  if (auto v = r.strings("ipv6")) {
    for (size_t i = 0; i < v->size(); ++i) {
      Ipv6Prefix a;
      std::string err = parse_prefix((*v)[i], AF_INET6, a.addr, a.prefix);
      if (!err.empty()) r.fail_key("ipv6[" + std::to_string(i) + "]", err);
      p.ipv6.push_back(a);
    }
  }
  if (p.ipv4.empty() && p.ipv6.empty()) {
    fail(r.src(), r.path(), "a port needs at least one address in ipv4 or ipv6 (RoCEv2 GIDs come from them)");
  }
  if (auto v = r.integer("vlan", 1, 4094)) p.vlan = static_cast<uint16_t>(*v);
  r.integer_into("vlan_pcp", p.vlan_pcp, 0, 7);
  if (p.vlan_pcp != 0 && !p.vlan) r.fail_key("vlan_pcp", "is set but vlan is not");
  r.integer_into("dscp", p.dscp, 0, 63);
  r.boolean_into("ecn", p.ecn);
  r.boolean_into("cnp", p.cnp);
  r.boolean_into("dcqcn", p.dcqcn.enabled);
  if (const toml::table* t = r.table("dcqcn_params")) {
    Reader dr(r.src(), *t, r.key_path("dcqcn_params"));
    read_dcqcn_params(dr, p.dcqcn);
  }
  if (const toml::table* t = r.table("fault")) {
    Reader fr(r.src(), *t, r.key_path("fault"));
    read_fault(fr, p.fault);
  }
  r.finish();
  return p;
}

void read_eal(Reader& r, EalConfig& e) {
  if (auto a = r.strings("args")) e.args = *a;
  r.string_into("lcores", e.lcores);
  if (auto m = r.integer("main_lcore", 0, kMaxLcore)) e.main_lcore = static_cast<uint32_t>(*m);
  for (const std::string& a : e.args) {
    bool lcore_flag = a == "-l" || a == "-c" || a.rfind("--lcores", 0) == 0 ||
                      (a.size() > 2 && (a.rfind("-l", 0) == 0 || a.rfind("-c", 0) == 0));
    if (lcore_flag && !e.lcores.empty()) {
      r.fail_key("args", quote(a) + " conflicts with eal.lcores; set the lcores in one place");
    }
    if (e.main_lcore && a.rfind("--main-lcore", 0) == 0) {
      r.fail_key("args", quote(a) + " conflicts with eal.main_lcore; set it in one place");
    }
  }
  r.finish();
}

void read_roce(Reader& r, RoceConfig& c) {
  if (auto v = r.integer("path_mtu", 0, INT64_MAX)) {
    if (*v != 256 && *v != 512 && *v != 1024 && *v != 2048 && *v != 4096) {
      r.fail_key("path_mtu", std::to_string(*v) + " is not an IB MTU (256, 512, 1024, 2048 or 4096)");
    }
    c.path_mtu = static_cast<uint32_t>(*v);
  }
  r.integer_into("max_qps", c.max_qps, 1, 1 << 20);
  r.integer_into("max_mrs", c.max_mrs, 1, 1 << 20);
  r.integer_into("mr_memory_mb", c.mr_memory_mb, 1, 1 << 20);
  r.integer_into("window", c.window, 1, 65536);
  r.integer_into("initial_window", c.initial_window, 0, 65536);
  if (c.initial_window > c.window)
    r.fail_key("initial_window", std::to_string(c.initial_window) + " is larger than window (" +
                                     std::to_string(c.window) + ")");
  r.integer_into("tail_timeout_us", c.tail_timeout_us, 0, 10'000'000);
  r.boolean_into("selective_repeat", c.selective_repeat);
  if (auto v = r.strings("selective_repeat_peers")) {
    for (size_t i = 0; i < v->size(); ++i) {
      std::array<uint8_t, 16> g{};
      std::array<uint8_t, 4> v4{};
      if (inet_pton(AF_INET, (*v)[i].c_str(), v4.data()) == 1) {
        g[10] = g[11] = 0xFF;  // IPv4-mapped, as RoCEv2 GIDs of IPv4 addresses
        std::copy(v4.begin(), v4.end(), g.begin() + 12);
      } else if (inet_pton(AF_INET6, (*v)[i].c_str(), g.data()) != 1) {
        r.fail_key("selective_repeat_peers[" + std::to_string(i) + "]",
                   quote((*v)[i]) + " is not an IPv4 or IPv6 address");
      }
      c.selective_repeat_peers.push_back(g);
    }
  }
  r.finish();
}

void read_control(Reader& r, ControlConfig& c) {
  if (auto s = r.string("socket")) {
    if (s->empty() || (*s)[0] != '/') r.fail_key("socket", quote(*s) + " is not an absolute path");
    if (s->size() > 107) {
      r.fail_key("socket", "path is " + std::to_string(s->size()) +
                               " bytes, longer than the 107 a Unix socket allows");
    }
    c.socket = *s;
  }
  if (const toml::node* n = r.node("mode")) {
    int64_t mode = -1;
    if (n->is_integer()) {
      mode = n->as_integer()->get();
    } else if (n->is_string()) {
      const std::string& s = n->as_string()->get();
      char* end = nullptr;
      errno = 0;
      long v = std::strtol(s.c_str(), &end, 8);
      if (s.empty() || *end != '\0' || errno != 0) r.fail_key("mode", quote(s) + " is not an octal mode (want \"0660\")");
      mode = v;
    } else {
      r.fail_key("mode", std::string("expected an octal string or integer, got ") + type_name(n->type()));
    }
    if (mode < 0 || mode > 0777) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0%llo", static_cast<long long>(mode));
      r.fail_key("mode", std::string(buf) + " is out of range 0..0777");
    }
    c.mode = static_cast<uint32_t>(mode);
  }
  if (auto g = r.string("group")) {
    if (!g->empty()) {
      struct group gr{};
      struct group* res = nullptr;
      std::vector<char> buf(16384);
      if (getgrnam_r(g->c_str(), &gr, buf.data(), buf.size(), &res) != 0 || res == nullptr) {
        r.fail_key("group", quote(*g) + " is not a group on this host");
      }
      c.gid = res->gr_gid;
    }
    c.group = *g;
  }
  r.integer_into("max_request", c.max_request, 256, 16 << 20);
  r.integer_into("max_clients", c.max_clients, 1, 1024);
  r.integer_into("idle_timeout_ms", c.idle_timeout_ms, 100, 3600000);
  r.finish();
}

void read_shim(Reader& r, ShimConfig& c) {
  r.boolean_into("enabled", c.enabled);
  if (auto s = r.string("socket")) {
    if (s->empty() || (*s)[0] != '/') r.fail_key("socket", quote(*s) + " is not an absolute path");
    if (s->size() > 107) r.fail_key("socket", "path is longer than the 107 bytes a Unix socket allows");
    c.socket = *s;
  }
  if (auto m = r.string("mode")) {
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(m->c_str(), &end, 8);
    if (m->empty() || *end != '\0' || errno != 0 || v < 0 || v > 0777)
      r.fail_key("mode", quote(*m) + " is not an octal mode (want \"0660\")");
    c.mode = static_cast<uint32_t>(v);
  }
  r.integer_into("max_clients", c.max_clients, 1, 4096);
  r.integer_into("max_qps_per_client", c.max_qps_per_client, 1, 1 << 20);
  r.integer_into("max_cqs_per_client", c.max_cqs_per_client, 1, 1 << 20);
  r.integer_into("max_srqs_per_client", c.max_srqs_per_client, 0, 1 << 20);
  r.integer_into("max_mrs_per_client", c.max_mrs_per_client, 0, 1 << 20);
  r.integer_into("max_ahs_per_client", c.max_ahs_per_client, 0, 1 << 20);
  r.integer_into("max_mr_mb_per_client", c.max_mr_mb_per_client, 0, uint64_t{1} << 24);
  r.integer_into("resolve_timeout_ms", c.resolve_timeout_ms, 10, 60000);
  r.finish();
}

void read_log(Reader& r, LogConfig& l) {
  if (auto s = r.string("level")) {
    if (!valid_log_level(*s)) {
      r.fail_key("level", quote(*s) + " is not a log level (trace, debug, info, warn, error, critical, off)");
    }
    l.level = *s;
  }
  r.string_into("file", l.file);
  r.finish();
}

std::string port_ref(const Config& c, uint32_t i) {
  return "port[" + std::to_string(i) + "] (" + quote(c.ports[i].name) + ")";
}

void read_cores(const Source& src, const toml::array& arr, Config& c) {
  std::set<uint32_t> lcores;
  for (size_t i = 0; i < arr.size(); ++i) {
    const toml::table& t = *arr[i].as_table();
    Reader r(src, t, "core[" + std::to_string(i) + "]");
    CoreConfig core;
    auto lc = r.integer("lcore", 0, kMaxLcore);
    if (!lc) fail(src, r.key_path("lcore"), "is required", &t);
    core.lcore = static_cast<uint32_t>(*lc);
    if (!lcores.insert(core.lcore).second) {
      r.fail_key("lcore", std::to_string(core.lcore) + " is already used by another [[core]]");
    }
    const toml::node* qn = r.typed("queues", toml::node_type::array);
    if (qn == nullptr || qn->as_array()->empty()) {
      fail(src, r.key_path("queues"), "a core needs at least one queue, e.g. queues = [{ port = \"p0\", rx = 0 }]", &t);
    }
    size_t qi = 0;
    for (const toml::node& qe : *qn->as_array()) {
      std::string qpath = r.key_path("queues") + "[" + std::to_string(qi++) + "]";
      if (!qe.is_table()) fail(src, qpath, std::string("expected a table, got ") + type_name(qe.type()), &qe);
      Reader qr(src, *qe.as_table(), qpath);
      std::string pname = qr.required_string("port");
      auto it = std::find_if(c.ports.begin(), c.ports.end(), [&](const PortConfig& p) { return p.name == pname; });
      if (it == c.ports.end()) qr.fail_key("port", quote(pname) + " is not a configured [[port]] name");
      QueueRef q;
      q.port = static_cast<uint32_t>(it - c.ports.begin());
      auto rx = qr.integer("rx", 0, kMaxQueues - 1);
      if (!rx) fail(src, qr.key_path("rx"), "is required", qe.as_table());
      q.rx = static_cast<uint16_t>(*rx);
      q.tx = q.rx;
      qr.integer_into("tx", q.tx, 0, kMaxQueues - 1);
      qr.finish();
      if (q.rx >= it->rx_queues) {
        qr.fail_key("rx", std::to_string(q.rx) + " is out of range 0.." + std::to_string(it->rx_queues - 1) +
                              " (" + port_ref(c, q.port) + " has rx_queues = " + std::to_string(it->rx_queues) + ")");
      }
      if (q.tx >= it->tx_queues) {
        qr.fail_key("tx", std::to_string(q.tx) + " is out of range 0.." + std::to_string(it->tx_queues - 1) +
                              " (" + port_ref(c, q.port) + " has tx_queues = " + std::to_string(it->tx_queues) + ")");
      }
      core.queues.push_back(q);
    }
    r.integer_into("idle_yield_polls", core.idle_yield_polls, 0, 1u << 30);
    r.finish();
    c.cores.push_back(std::move(core));
  }
}

// Without [[core]]: core i runs on lcore i and owns rx and tx queue i of every
// port that has that many rx queues.
void derive_cores(Config& c) {
  uint16_t n = 0;
  for (const PortConfig& p : c.ports) n = std::max(n, p.rx_queues);
  for (uint16_t i = 0; i < n; ++i) {
    CoreConfig core;
    core.lcore = i;
    for (uint32_t pi = 0; pi < c.ports.size(); ++pi) {
      const PortConfig& p = c.ports[pi];
      if (i >= p.rx_queues) continue;
      if (i >= p.tx_queues) {
        throw ConfigError("config: " + port_ref(c, pi) + ".tx_queues: " + std::to_string(p.tx_queues) +
                          " is less than rx_queues (" + std::to_string(p.rx_queues) +
                          "); without [[core]] sections each core needs its own tx queue");
      }
      core.queues.push_back({pi, i, i});
    }
    c.cores.push_back(std::move(core));
  }
  c.cores_derived = true;
}

// "0,1,4-6" -> {0,1,4,5,6}; nullopt for the richer --lcores syntax
// ("(0-3)@(0-1)", "1@2"), which this check leaves to EAL.
std::optional<std::set<uint32_t>> simple_lcore_list(const std::string& s) {
  if (s.empty() || s.find_first_not_of("0123456789,-") != std::string::npos) return std::nullopt;
  std::set<uint32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t dash = item.find('-');
    try {
      if (dash == std::string::npos) {
        out.insert(static_cast<uint32_t>(std::stoul(item)));
      } else {
        uint32_t a = static_cast<uint32_t>(std::stoul(item.substr(0, dash)));
        uint32_t b = static_cast<uint32_t>(std::stoul(item.substr(dash + 1)));
        if (a > b || b > kMaxLcore) return std::nullopt;
        for (uint32_t i = a; i <= b; ++i) out.insert(i);
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return out;
}

void check_config(Config& c) {
  if (c.shim.enabled && c.shim.socket == c.control.socket)
    throw ConfigError("config: shim.socket: " + quote(c.shim.socket) + " is also control.socket");
  // Cores and the main lcore must be lcores EAL starts (when the list is simple).
  if (auto lcores = simple_lcore_list(c.eal.lcores)) {
    for (size_t i = 0; i < c.cores.size(); ++i) {
      if (lcores->count(c.cores[i].lcore) == 0) {
        throw ConfigError("config: core[" + std::to_string(i) + "].lcore: " + std::to_string(c.cores[i].lcore) +
                          " is not in eal.lcores \"" + c.eal.lcores + "\"" +
                          (c.cores_derived ? " (cores derived from the ports' rx_queues; add [[core]] sections)" : ""));
      }
    }
    if (c.eal.main_lcore && lcores->count(*c.eal.main_lcore) == 0) {
      throw ConfigError("config: eal.main_lcore: " + std::to_string(*c.eal.main_lcore) + " is not in eal.lcores \"" +
                        c.eal.lcores + "\"");
    }
  }
  // Unique port names and addresses.
  std::set<std::string> names;
  std::map<std::array<uint8_t, 4>, uint32_t> v4;
  std::map<std::array<uint8_t, 16>, uint32_t> v6;
  for (uint32_t i = 0; i < c.ports.size(); ++i) {
    const PortConfig& p = c.ports[i];
    if (!names.insert(p.name).second) {
      throw ConfigError("config: port[" + std::to_string(i) + "].name: " + quote(p.name) +
                        " is already the name of another port");
    }
    for (const Ipv4Prefix& a : p.ipv4) {
      auto [it, fresh] = v4.emplace(a.addr, i);
      if (!fresh) {
        throw ConfigError("config: port[" + std::to_string(i) + "].ipv4: " + format_ipv4(a) +
                          " is already an address of " + port_ref(c, it->second));
      }
    }
    for (const Ipv6Prefix& a : p.ipv6) {
      auto [it, fresh] = v6.emplace(a.addr, i);
      if (!fresh) {
        throw ConfigError("config: port[" + std::to_string(i) + "].ipv6: " + format_ipv6(a) +
                          " is already an address of " + port_ref(c, it->second));
      }
    }
    uint32_t fit = ib_mtu_for_ip_mtu(p.mtu);
    if (c.roce.path_mtu > fit) {
      throw ConfigError("config: roce.path_mtu: " + std::to_string(c.roce.path_mtu) + " does not fit " +
                        port_ref(c, i) + " with mtu " + std::to_string(p.mtu) +
                        (fit == 0 ? std::string(" (no IB MTU fits)")
                                  : " (largest IB MTU that fits: " + std::to_string(fit) + ")"));
    }
  }
  // Queue ownership: every rx queue by exactly one core, a tx queue by at most one.
  std::map<std::pair<uint32_t, uint16_t>, size_t> rx_owner, tx_owner;
  for (size_t ci = 0; ci < c.cores.size(); ++ci) {
    for (const QueueRef& q : c.cores[ci].queues) {
      auto [rit, rfresh] = rx_owner.emplace(std::make_pair(q.port, q.rx), ci);
      if (!rfresh) {
        throw ConfigError("config: core[" + std::to_string(ci) + "].queues: rx queue " + std::to_string(q.rx) +
                          " of " + port_ref(c, q.port) + " is already owned by core[" +
                          std::to_string(rit->second) + "]");
      }
      auto [tit, tfresh] = tx_owner.emplace(std::make_pair(q.port, q.tx), ci);
      if (!tfresh && tit->second != ci) {
        throw ConfigError("config: core[" + std::to_string(ci) + "].queues: tx queue " + std::to_string(q.tx) +
                          " of " + port_ref(c, q.port) + " is already used by core[" +
                          std::to_string(tit->second) + "] (a tx queue has one writer)");
      }
    }
  }
  for (uint32_t i = 0; i < c.ports.size(); ++i) {
    for (uint16_t q = 0; q < c.ports[i].rx_queues; ++q) {
      if (rx_owner.count({i, q}) == 0) {
        throw ConfigError("config: port[" + std::to_string(i) + "].rx_queues: rx queue " + std::to_string(q) +
                          " of " + quote(c.ports[i].name) + " is not owned by any [[core]]");
      }
    }
  }
}

}  // namespace

const std::vector<DcqcnKey>& dcqcn_keys() {
  using D = DcqcnConfig;
  constexpr uint32_t kMaxMbps = 1'600'000;  // 1.6 Tb/s
  constexpr uint32_t kMaxUs = 10'000'000;   // 10 s
  static const std::vector<DcqcnKey> keys = {
      {"line_rate_mbps", &D::line_rate_mbps, 1, kMaxMbps, "rate before the first CNP, and the most a QP recovers to (Mb/s)"},
      {"alpha_g", &D::alpha_g, 0, 1024, "alpha keeps g/1024 of itself per update (NVIDIA dce_tcp_g)"},
      {"initial_alpha", &D::initial_alpha, 0, 1024, "alpha on the first CNP, of 1024"},
      {"alpha_update_period_us", &D::alpha_update_period_us, 1, kMaxUs, "alpha update period (us)"},
      {"rate_reduce_monitor_period_us", &D::rate_reduce_monitor_period_us, 0, kMaxUs,
       "at most one rate decrease per period (us)"},
      {"time_reset_us", &D::time_reset_us, 1, kMaxUs, "timer increase period (us)"},
      {"byte_reset", &D::byte_reset, 1, UINT32_MAX, "byte-counter increase period, in 64-byte units"},
      {"threshold", &D::threshold, 1, 31, "fast-recovery stages before additive increase"},
      {"ai_rate_mbps", &D::ai_rate_mbps, 1, kMaxMbps, "additive increase (Mb/s)"},
      {"hai_rate_mbps", &D::hai_rate_mbps, 1, kMaxMbps, "hyper increase (Mb/s)"},
      {"min_rate_mbps", &D::min_rate_mbps, 1, kMaxMbps, "the lowest rate a decrease leaves (Mb/s)"},
      {"min_dec_fac_pct", &D::min_dec_fac_pct, 1, 100, "one decrease cuts at most this share of the rate (%)"},
      {"stall_hold_us", &D::stall_hold_us, 0, kMaxUs,
       "a gap past this between a QP's updates (the poll loop descheduled) does not count as time (us; 0: off)"},
      {"validate_rate", &D::validate_rate, 0, 1,
       "1: the timer raises a QP's rate only if the pacer held it back since the last change (0: always)"},
      {"window_us", &D::window_us, 0, kMaxUs,
       "a limited QP keeps at most its rate x this in flight (us; 0: no bound but the window)"},
      {"clamp_tgt_rate", &D::clamp_tgt_rate, 0, 1,
       "1: every decrease sets the target rate to the current one (0: only after a timer increase)"},
      {"min_time_between_cnps_us", &D::min_time_between_cnps_us, 0, kMaxUs, "at most one CNP per QP per period (us)"},
      {"cnp_dscp", &D::cnp_dscp, 0, 63, "DSCP of the CNPs this port sends"},
      {"cnp_prio", &D::cnp_prio, 0, 7, "802.1p priority of the CNPs this port sends (VLAN ports)"},
  };
  return keys;
}

std::string set_dcqcn_key(DcqcnConfig& c, std::string_view key, int64_t value) {
  for (const DcqcnKey& k : dcqcn_keys()) {
    if (key != k.name) continue;
    if (value < k.lo || value > k.hi) {
      return std::string(key) + ": " + std::to_string(value) + " is out of range " + std::to_string(k.lo) + ".." +
             std::to_string(k.hi);
    }
    c.*k.field = static_cast<uint32_t>(value);
    return {};
  }
  std::string list;
  for (const DcqcnKey& k : dcqcn_keys()) list += (list.empty() ? "" : ", ") + std::string(k.name);
  return std::string(key) + ": unknown key (known keys: " + list + ")";
}

std::string check_dcqcn(const DcqcnConfig& c) {
  auto too_big = [&](const char* a, uint32_t va, const char* b, uint32_t vb) {
    return std::string(a) + " (" + std::to_string(va) + ") is above " + b + " (" + std::to_string(vb) + ")";
  };
  if (c.min_rate_mbps > c.line_rate_mbps) return too_big("min_rate_mbps", c.min_rate_mbps, "line_rate_mbps", c.line_rate_mbps);
  if (c.ai_rate_mbps > c.hai_rate_mbps) return too_big("ai_rate_mbps", c.ai_rate_mbps, "hai_rate_mbps", c.hai_rate_mbps);
  if (c.hai_rate_mbps > c.line_rate_mbps) return too_big("hai_rate_mbps", c.hai_rate_mbps, "line_rate_mbps", c.line_rate_mbps);
  return {};
}

const PortConfig* Config::find_port(std::string_view name) const {
  for (const PortConfig& p : ports) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

uint32_t ib_mtu_for_ip_mtu(uint32_t ip_mtu) {
  constexpr uint32_t kOverhead = 96;  // 40 (GRH or IP) + 8 UDP + 12 BTH + 28 (largest ext) + 4 ICRC + 4 (XRC)
  if (ip_mtu < kOverhead) return 0;
  uint32_t room = ip_mtu - kOverhead;
  for (uint32_t m = 4096; m >= 256; m /= 2) {
    if (m <= room) return m;
  }
  return 0;
}

std::string format_ipv4(const Ipv4Prefix& p) {
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, p.addr.data(), buf, sizeof buf);
  return std::string(buf) + "/" + std::to_string(p.prefix);
}

std::string format_ipv6(const Ipv6Prefix& p) {
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, p.addr.data(), buf, sizeof buf);
  return std::string(buf) + "/" + std::to_string(p.prefix);
}

std::string format_mac(const std::array<uint8_t, 6>& m) {
  char buf[18];
  std::snprintf(buf, sizeof buf, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return buf;
}

bool valid_log_level(std::string_view l) {
  return l == "trace" || l == "debug" || l == "info" || l == "warn" || l == "error" || l == "critical" ||
         l == "off";
}

Config parse_config(std::string_view text, std::string_view source) {
  Source src{std::string(source)};
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw ConfigError("config: " + src.name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                      ": " + std::string(e.description()));
  }
  Config c;
  c.source = src.name;
  Reader r(src, root, "");
  if (const toml::table* t = r.table("eal")) {
    Reader er(src, *t, "eal");
    read_eal(er, c.eal);
  }
  // [roce] is read before the ports so check_config() can compare MTUs.
  if (const toml::table* t = r.table("roce")) {
    Reader rr(src, *t, "roce");
    read_roce(rr, c.roce);
  }
  const toml::array* ports = r.table_array("port");
  if (ports == nullptr || ports->empty()) {
    throw ConfigError("config: port: at least one [[port]] section is required");
  }
  for (size_t i = 0; i < ports->size(); ++i) {
    Reader pr(src, *(*ports)[i].as_table(), "port[" + std::to_string(i) + "]");
    c.ports.push_back(read_port(pr));
  }
  // Names must be unique before [[core]] refers to them.
  for (size_t i = 1; i < c.ports.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (c.ports[i].name == c.ports[j].name) {
        throw ConfigError("config: port[" + std::to_string(i) + "].name: " + quote(c.ports[i].name) +
                          " is already the name of port[" + std::to_string(j) + "]");
      }
    }
  }
  if (const toml::array* cores = r.table_array("core")) {
    if (cores->empty()) throw ConfigError("config: core: empty");
    read_cores(src, *cores, c);
  } else {
    derive_cores(c);
  }
  if (const toml::table* t = r.table("control")) {
    Reader cr(src, *t, "control");
    read_control(cr, c.control);
  }
  if (const toml::table* t = r.table("shim")) {
    Reader sr(src, *t, "shim");
    read_shim(sr, c.shim);
  }
  if (const toml::table* t = r.table("log")) {
    Reader lr(src, *t, "log");
    read_log(lr, c.log);
  }
  r.finish();
  check_config(c);
  return c;
}

Config load_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError("config: cannot read " + path + ": " + std::strerror(errno));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ConfigError("config: error reading " + path);
  return parse_config(ss.str(), path);
}

}  // namespace droce::config
