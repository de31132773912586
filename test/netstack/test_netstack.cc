// lib/netstack: every function fed hand-built frames (frames.h); each test
// says what it sends ("Receive") and what must come out ("Expect").
#include <catch2/catch.hpp>

#include <cstring>

#include "frames.h"
#include "netstack/netstack.h"

using namespace droce;
using namespace droce::netstack;
using namespace droce::test;

namespace {

constexpr wire::MacAddr kOurMac{0x02, 0, 0, 0, 0, 0x02};
constexpr wire::MacAddr kPeerMac{0x02, 0, 0, 0, 0, 0x01};
constexpr wire::MacAddr kOtherMac{0x02, 0, 0, 0, 0, 0x77};
constexpr wire::MacAddr kBcast{0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
constexpr wire::MacAddr kZeroMac{};
constexpr uint32_t kOurIp = 0x0A630002;   // 10.99.0.2
constexpr uint32_t kPeerIp = 0x0A630001;  // 10.99.0.1
constexpr uint64_t kSec = 1'000'000'000ull;

wire::Gid ip6(const char* s) { return *parse_ip(s); }

HostConfig host(uint16_t vlan = 0) {
  HostConfig c;
  c.mac = kOurMac;
  c.ipv4 = {kOurIp};
  c.ipv6 = {ip6("fd00:99::2")};
  c.vlan = vlan;
  c.neigh.entries = 16;
  return c;
}

struct Out {
  uint8_t buf[NetStack::kMaxReplyLen];
  std::span<uint8_t> span() { return {buf, sizeof buf}; }
  Bytes bytes(uint32_t n) const { return Bytes(buf, buf + n); }
};

Result feed(NetStack& s, const Bytes& f, Out& o, uint64_t now = 0) { return s.handle({f.data(), f.size()}, o.span(), now); }

}  // namespace

TEST_CASE("GID table is numbered as Linux rxe numbers it") {
  // Receive: MAC 52:54:00:12:34:56, IPv4 10.99.0.2 and 10.99.1.2, IPv6 fd00:99::2 (listed twice).
  GidTable t({0x52, 0x54, 0x00, 0x12, 0x34, 0x56}, {kOurIp, 0x0A630102}, {ip6("fd00:99::2"), ip6("fd00:99::2")});
  // Expect: 0 link-local EUI-64, 1-2 IPv4-mapped in order, 3 the IPv6 address once.
  REQUIRE(t.size() == 4);
  CHECK(gid_to_string(t.at(0)) == "fe80::5054:ff:fe12:3456");
  CHECK(gid_to_string(t.at(1)) == "10.99.0.2");
  CHECK(t.at(1) == wire::gid_from_ipv4(kOurIp));
  CHECK(gid_to_string(t.at(2)) == "10.99.1.2");
  CHECK(gid_to_string(t.at(3)) == "fd00:99::2");
  CHECK(t.index_of(wire::gid_from_ipv4(0x0A630102)) == 2);
  CHECK(t.index_of(ip6("fd00::9")) == -1);
  CHECK(gid_to_string(solicited_node(ip6("fd00:99::1234:5678"))) == "ff02::1:ff34:5678");
  CHECK_FALSE(parse_ip("10.99.0.300"));
  NetStack s(host());
  CHECK(gid_to_string(s.gids().at(0)) == "fe80::ff:fe00:2");
}

TEST_CASE("ARP request for our address is answered and teaches us the sender") {
  NetStack s(host());
  Out o;
  // Receive: who-has 10.99.0.2 tell 10.99.0.1, broadcast.
  const Result r = feed(s, arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kOurIp), o, 5);
  // Expect: is-at reply to the asker, padded to 60 bytes, exact bytes.
  REQUIRE(r.verdict == Verdict::Reply);
  Bytes want = arp(kPeerMac, 2, kOurMac, kOurIp, kPeerMac, kPeerIp);
  want.resize(60, 0);
  CHECK(o.bytes(r.reply_len) == want);
  CHECK(s.counters().arp_replies_sent == 1);
  const NeighEntry* e = s.neighbours().find(wire::gid_from_ipv4(kPeerIp));
  REQUIRE(e != nullptr);
  CHECK(e->state == NeighState::Reachable);
  CHECK(e->mac == kPeerMac);
}

TEST_CASE("ARP frames that are not ours are dropped with a reason") {
  NetStack s(host());
  Out o;
  // Receive: who-has another host -> Expect: dropped, nothing learned.
  CHECK(feed(s, arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, 0x0A630009), o).drop == Drop::ArpNotForUs);
  CHECK(s.neighbours().used() == 0);
  // Receive: hardware length 8 -> malformed.
  Bytes bad = arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kOurIp);
  bad[14 + 4] = 8;
  CHECK(feed(s, bad, o).drop == Drop::ArpMalformed);
  // Receive: truncated ARP -> malformed.
  Bytes shortf = arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kOurIp);
  shortf.resize(14 + 20);
  CHECK(feed(s, shortf, o).drop == Drop::ArpMalformed);
  // Receive: someone else claims our address -> conflict.
  CHECK(feed(s, arp(kBcast, 1, kOtherMac, kOurIp, kZeroMac, kOurIp), o).drop == Drop::ArpConflict);
  // Receive: opcode 3 -> malformed.
  CHECK(feed(s, arp(kBcast, 3, kPeerMac, kPeerIp, kZeroMac, kOurIp), o).drop == Drop::ArpMalformed);
  CHECK(s.counters().drop(Drop::ArpMalformed) == 3);
  CHECK(s.counters().dropped() == 5);
}

TEST_CASE("resolving an IPv4 peer: request, pending, reply, reachable, stale probe") {
  NetStack s(host());
  Out o, req;
  wire::MacAddr mac{};
  uint32_t len = 0;
  const wire::Gid peer = wire::gid_from_ipv4(kPeerIp);
  // Expect: the first lookup writes a broadcast who-has.
  REQUIRE(s.resolve(peer, 0, mac, req.span(), len) == NetStack::Resolve::Request);
  Bytes want = arp(kBcast, 1, kOurMac, kOurIp, kZeroMac, kPeerIp);
  want.resize(60, 0);
  CHECK(req.bytes(len) == want);
  // Expect: asking again before the answer sends nothing.
  CHECK(s.resolve(peer, 1, mac, req.span(), len) == NetStack::Resolve::Pending);
  CHECK(len == 0);
  // Receive: the peer's reply -> Expect: consumed, then Ready with its MAC.
  CHECK(feed(s, arp(kOurMac, 2, kPeerMac, kPeerIp, kOurMac, kOurIp), o, 2).verdict == Verdict::Consumed);
  CHECK(s.resolve(peer, 3, mac, req.span(), len) == NetStack::Resolve::Ready);
  CHECK(mac == kPeerMac);
  // After reachable time: still usable, and a unicast confirmation request.
  const uint64_t later = 3 + 31 * kSec;
  REQUIRE(s.resolve(peer, later, mac, req.span(), len) == NetStack::Resolve::ReadyProbe);
  CHECK(mac == kPeerMac);
  CHECK(std::equal(kPeerMac.begin(), kPeerMac.end(), req.buf));  // unicast to the old MAC
  // Nobody answers: the timer probes twice more, then the entry fails.
  CHECK(s.poll_timers(later + kSec / 2, req.span()) == 0);
  CHECK(s.poll_timers(later + kSec, req.span()) == 60);
  CHECK(s.poll_timers(later + 2 * kSec, req.span()) == 60);
  CHECK(s.poll_timers(later + 3 * kSec, req.span()) == 0);
  CHECK(s.resolve(peer, later + 3 * kSec, mac, req.span(), len) == NetStack::Resolve::Failed);
  // After the hold time a new resolution starts.
  CHECK(s.resolve(peer, later + 7 * kSec, mac, req.span(), len) == NetStack::Resolve::Request);
  CHECK(s.counters().arp_requests_sent == 5);
}

TEST_CASE("an unanswered ARP resolution is retried, then fails") {
  NetStack s(host());
  Out req;
  wire::MacAddr mac{};
  uint32_t len = 0;
  const wire::Gid peer = wire::gid_from_ipv4(0x0A630033);
  REQUIRE(s.resolve(peer, 0, mac, req.span(), len) == NetStack::Resolve::Request);
  CHECK(s.poll_timers(kSec - 1, req.span()) == 0);         // not due yet
  CHECK(s.poll_timers(kSec, req.span()) == 60);            // retry 1
  CHECK(req.buf[14 + 7] == 1);                             // an ARP request
  CHECK(s.poll_timers(2 * kSec, req.span()) == 60);        // retry 2 (3 sent)
  CHECK(s.poll_timers(3 * kSec, req.span()) == 0);         // out of probes
  CHECK(s.neighbours().find(peer)->state == NeighState::Failed);
  CHECK(s.resolve(peer, 3 * kSec, mac, req.span(), len) == NetStack::Resolve::Failed);
}

TEST_CASE("gratuitous ARP: we announce ours; others' refresh only known entries") {
  NetStack s(host());
  Out o;
  const uint32_t n = s.gratuitous_arp(0, o.span());
  Bytes want = arp(kBcast, 1, kOurMac, kOurIp, kZeroMac, kOurIp);
  want.resize(60, 0);
  CHECK(o.bytes(n) == want);
  CHECK(s.gratuitous_arp(1, o.span()) == 0);
  // Receive: gratuitous ARP from an unknown host -> consumed, not learned.
  CHECK(feed(s, arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kPeerIp), o).verdict == Verdict::Consumed);
  CHECK(s.neighbours().find(wire::gid_from_ipv4(kPeerIp)) == nullptr);
  // Learn the peer, then it moves to a new MAC and announces it.
  feed(s, arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kOurIp), o);
  feed(s, arp(kBcast, 1, kOtherMac, kPeerIp, kZeroMac, kPeerIp), o);
  CHECK(s.neighbours().find(wire::gid_from_ipv4(kPeerIp))->mac == kOtherMac);
}

TEST_CASE("ICMP echo request to us is answered with the same payload") {
  NetStack s(host());
  Out o;
  // Receive: ping 10.99.0.1 -> 10.99.0.2, id 0x77, seq 3, 56 bytes.
  const Bytes req = ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 1, icmp_echo(8, 0x77, 3, 56));
  const Result r = feed(s, req, o);
  REQUIRE(r.verdict == Verdict::Reply);
  // Expect: echo reply to the sender's MAC, addresses swapped, both checksums valid.
  const Bytes rep = o.bytes(r.reply_len);
  REQUIRE(rep.size() == req.size());
  CHECK(std::equal(kPeerMac.begin(), kPeerMac.end(), rep.begin()));
  CHECK(std::equal(kOurMac.begin(), kOurMac.end(), rep.begin() + 6));
  CHECK(inet_csum(rep, 14, 20) == 0);
  CHECK(std::equal(req.begin() + 26, req.begin() + 30, rep.begin() + 30));  // src -> dst
  CHECK(std::equal(req.begin() + 30, req.begin() + 34, rep.begin() + 26));
  CHECK(rep[34] == 0);                                                      // echo reply
  CHECK(inet_csum(rep, 34, rep.size() - 34) == 0);
  CHECK(std::equal(req.begin() + 38, req.end(), rep.begin() + 38));         // id, seq, payload
  CHECK(s.counters().echo_replies_sent == 1);
  // Tiny ping: the reply is padded to the Ethernet minimum.
  const Result r2 = feed(s, ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 1, icmp_echo(8, 1, 1, 0)), o);
  CHECK(r2.verdict == Verdict::Reply);
  CHECK(r2.reply_len == 60);
}

TEST_CASE("IPv4 frames that are not ours or are broken are dropped by reason") {
  NetStack s(host());
  Out o;
  const Bytes echo = icmp_echo(8, 1, 1, 8);
  CHECK(feed(s, ipv4(kOurMac, kPeerMac, kPeerIp, 0x0A630009, 1, echo), o).drop == Drop::Ipv4NotForUs);
  CHECK(feed(s, ipv4(kBcast, kPeerMac, kPeerIp, 0xFFFFFFFF, 1, echo), o).drop == Drop::Ipv4NotForUs);
  CHECK(feed(s, ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 1, echo, 0x2000), o).drop == Drop::Ipv4Fragment);
  CHECK(feed(s, ipv4(kOurMac, kPeerMac, 0xFFFFFFFF, kOurIp, 1, echo), o).drop == Drop::Ipv4BadSource);
  CHECK(feed(s, ipv4(kOurMac, kPeerMac, 0xE0000001, kOurIp, 1, echo), o).drop == Drop::Ipv4BadSource);
  CHECK(feed(s, ipv4(kOurMac, kPeerMac, 0, kOurIp, 1, echo), o).drop == Drop::Ipv4BadSource);
  CHECK(feed(s, ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 1, icmp_echo(13, 1, 1, 8)), o).drop == Drop::IcmpUnhandled);
  Bytes badsum = ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 1, echo);
  badsum.back() ^= 1;
  CHECK(feed(s, badsum, o).drop == Drop::IcmpMalformed);
  Bytes badip = ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 1, echo);
  badip[14 + 8] = 3;  // TTL changed, checksum not
  CHECK(feed(s, badip, o).drop == Drop::Ipv4Malformed);
  Bytes toolong = ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 1, echo);
  toolong.resize(toolong.size() - 4);  // total length now exceeds the frame
  CHECK(feed(s, toolong, o).drop == Drop::Ipv4Malformed);
  CHECK(feed(s, ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 6, Bytes(20, 0)), o).drop == Drop::IpProtoUnhandled);
  CHECK(feed(s, ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 17, udp(1000, 53, 10)), o).drop == Drop::UdpNotRoce);
  CHECK(feed(s, ipv4(kOtherMac, kPeerMac, kPeerIp, kOurIp, 1, echo), o).drop == Drop::NotOurMac);
  CHECK(feed(s, eth(kOurMac, kPeerMac, 0x88CC), o).drop == Drop::UnknownEthertype);
  CHECK(feed(s, Bytes(10, 0), o).drop == Drop::Runt);
}

TEST_CASE("RoCEv2 frames to our address go to the transport") {
  NetStack s(host());
  Out o;
  const Result r = feed(s, ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 17, udp(0xC000, 4791, 40)), o);
  CHECK(r.verdict == Verdict::Roce);
  CHECK(r.l3_off == 14);
  const Result r6 = feed(s, ipv6(kOurMac, kPeerMac, ip6("fd00:99::1"), ip6("fd00:99::2"), 17, udp(0xC000, 4791, 40)), o);
  CHECK(r6.verdict == Verdict::Roce);
  CHECK(s.counters().roce == 2);
  // A RoCEv2 frame whose UDP length exceeds the packet is malformed.
  Bytes u = udp(0xC000, 4791, 40);
  u[5] = 200;
  CHECK(feed(s, ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 17, u), o).drop == Drop::UdpMalformed);
}

TEST_CASE("ICMPv6 echo to our global and link-local addresses is answered") {
  NetStack s(host());
  Out o;
  const wire::Gid peer = ip6("fd00:99::1");
  for (const wire::Gid& ours : {ip6("fd00:99::2"), ip6("fe80::ff:fe00:2")}) {
    Bytes msg = icmp_echo(128, 9, 4, 32);
    const Bytes req = ipv6(kOurMac, kPeerMac, peer, ours, 58, msg, 64);
    const Result r = feed(s, req, o);
    REQUIRE(r.verdict == Verdict::Reply);
    const Bytes rep = o.bytes(r.reply_len);
    REQUIRE(rep.size() == req.size());
    CHECK(std::equal(kPeerMac.begin(), kPeerMac.end(), rep.begin()));
    CHECK(std::equal(ours.begin(), ours.end(), rep.begin() + 22));   // src
    CHECK(std::equal(peer.begin(), peer.end(), rep.begin() + 38));   // dst
    CHECK(rep[54] == 129);
    CHECK(inet_csum(rep, 54, rep.size() - 54, pseudo6(ours, peer, static_cast<uint32_t>(rep.size() - 54), 58)) == 0);
    CHECK(std::equal(req.begin() + 58, req.end(), rep.begin() + 58));
  }
  CHECK(s.counters().echo6_replies_sent == 2);
  // Bad checksum, other destination, ping to all-nodes, extension header, MLD.
  Bytes bad = ipv6(kOurMac, kPeerMac, peer, ip6("fd00:99::2"), 58, icmp_echo(128, 1, 1, 8), 64);
  bad.back() ^= 0x10;
  CHECK(feed(s, bad, o).drop == Drop::Icmpv6Malformed);
  CHECK(feed(s, ipv6(kOurMac, kPeerMac, peer, ip6("fd00:99::9"), 58, icmp_echo(128, 1, 1, 8)), o).drop ==
        Drop::Ipv6NotForUs);
  CHECK(feed(s, ipv6({0x33, 0x33, 0, 0, 0, 1}, kPeerMac, peer, ip6("ff02::1"), 58, icmp_echo(128, 1, 1, 8)), o).drop ==
        Drop::Icmpv6Unhandled);
  CHECK(feed(s, ipv6(kOurMac, kPeerMac, peer, ip6("fd00:99::2"), 0, Bytes(8, 0)), o).drop == Drop::Ipv6ExtHeader);
  CHECK(feed(s, ipv6({0x33, 0x33, 0, 0, 0, 1}, kPeerMac, peer, ip6("ff02::1"), 58, Bytes{130, 0, 0, 0, 0, 0, 0, 0}),
             o)
            .drop == Drop::Icmpv6Unhandled);
}

TEST_CASE("neighbour solicitation for our address gets an advertisement") {
  NetStack s(host());
  Out o;
  const wire::Gid peer = ip6("fd00:99::1");
  const wire::Gid ours = ip6("fd00:99::2");
  const wire::Gid snm = ip6("ff02::1:ff00:2");
  // Receive: NS for fd00:99::2 to its solicited-node group, with the sender's MAC.
  const Result r = feed(s, ipv6({0x33, 0x33, 0xff, 0, 0, 2}, kPeerMac, peer, snm, 58, nd(135, 0, ours, &kPeerMac)), o, 7);
  REQUIRE(r.verdict == Verdict::Reply);
  // Expect: NA (Solicited, Override) from our address to the sender, with our MAC.
  Bytes want = ipv6(kPeerMac, kOurMac, ours, peer, 58, nd(136, 0x60, ours, &kOurMac));
  CHECK(o.bytes(r.reply_len) == want);
  CHECK(s.neighbours().find(peer)->mac == kPeerMac);
  CHECK(s.counters().na_sent == 1);

  // Receive: duplicate address detection probe (source ::) -> NA to all nodes, not Solicited.
  const Result d = feed(s, ipv6({0x33, 0x33, 0xff, 0, 0, 2}, kPeerMac, wire::Gid{}, snm, 58, nd(135, 0, ours, nullptr)), o);
  REQUIRE(d.verdict == Verdict::Reply);
  CHECK(o.bytes(d.reply_len) == ipv6({0x33, 0x33, 0, 0, 0, 1}, kOurMac, ours, ip6("ff02::1"), 58, nd(136, 0x20, ours, &kOurMac)));

  // Receive: NS for our link-local, unicast.
  const wire::Gid ll = ip6("fe80::ff:fe00:2");
  CHECK(feed(s, ipv6(kOurMac, kPeerMac, ip6("fe80::1"), ll, 58, nd(135, 0, ll, &kPeerMac)), o).verdict == Verdict::Reply);

  // Not ours / invalid.
  CHECK(feed(s, ipv6(kOurMac, kPeerMac, peer, ours, 58, nd(135, 0, ip6("fd00:99::9"), &kPeerMac)), o).drop ==
        Drop::NdNotForUs);
  CHECK(feed(s, ipv6(kOurMac, kPeerMac, peer, ours, 58, nd(135, 0, ours, &kPeerMac), 254), o).drop == Drop::NdMalformed);
  Bytes zero_opt = nd(135, 0, ours, &kPeerMac);
  zero_opt[25] = 0;  // option length 0
  CHECK(feed(s, ipv6(kOurMac, kPeerMac, peer, ours, 58, zero_opt), o).drop == Drop::NdMalformed);
  CHECK(feed(s, ipv6({0x33, 0x33, 0xff, 0, 0, 9}, kPeerMac, peer, ip6("ff02::1:ff00:9"), 58, nd(135, 0, ip6("fd00:99::9"), nullptr)), o).drop ==
        Drop::NotOurMac);
}

TEST_CASE("resolving an IPv6 peer: NS to its solicited-node group, NA completes it") {
  NetStack s(host());
  Out o, req;
  wire::MacAddr mac{};
  uint32_t len = 0;
  const wire::Gid peer = ip6("fd00:99::1");
  REQUIRE(s.resolve(peer, 0, mac, req.span(), len) == NetStack::Resolve::Request);
  // Expect: NS from our first global address, with our MAC as SLLA.
  CHECK(req.bytes(len) == ipv6({0x33, 0x33, 0xff, 0, 0, 1}, kOurMac, ip6("fd00:99::2"), ip6("ff02::1:ff00:1"), 58,
                               nd(135, 0, peer, &kOurMac)));
  CHECK(s.counters().ns_sent == 1);
  // Receive: an unsolicited NA for another address -> consumed, not learned.
  CHECK(feed(s, ipv6(kOurMac, kPeerMac, ip6("fd00:99::7"), ip6("fd00:99::2"), 58, nd(136, 0x60, ip6("fd00:99::7"), &kPeerMac)), o)
            .verdict == Verdict::Consumed);
  CHECK(s.neighbours().find(ip6("fd00:99::7")) == nullptr);
  // Receive: the peer's NA.
  CHECK(feed(s, ipv6(kOurMac, kPeerMac, peer, ip6("fd00:99::2"), 58, nd(136, 0x60, peer, &kPeerMac)), o, 1).verdict ==
        Verdict::Consumed);
  CHECK(s.resolve(peer, 2, mac, req.span(), len) == NetStack::Resolve::Ready);
  CHECK(mac == kPeerMac);
  // Solicited flag on a multicast NA is invalid.
  CHECK(feed(s, ipv6({0x33, 0x33, 0, 0, 0, 1}, kPeerMac, peer, ip6("ff02::1"), 58, nd(136, 0x60, peer, &kPeerMac)), o).drop ==
        Drop::NdMalformed);
}

TEST_CASE("VLAN: only frames of our VLAN are accepted, and replies are tagged") {
  NetStack s(host(100));
  Out o;
  CHECK(feed(s, arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kOurIp), o).drop == Drop::VlanMismatch);
  CHECK(feed(s, arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kOurIp, 200), o).drop == Drop::VlanMismatch);
  const Result r = feed(s, arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kOurIp, 100), o);
  REQUIRE(r.verdict == Verdict::Reply);
  Bytes want = arp(kPeerMac, 2, kOurMac, kOurIp, kPeerMac, kPeerIp, 100);
  want.resize(std::max<size_t>(want.size(), 60), 0);
  CHECK(o.bytes(r.reply_len) == want);
  const Result p = feed(s, ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 1, icmp_echo(8, 1, 2, 20), 0x4000, 100), o);
  REQUIRE(p.verdict == Verdict::Reply);
  CHECK(rd16(o.buf + 12) == 0x8100);
  CHECK((rd16(o.buf + 14) & 0xFFF) == 100);
  CHECK(o.buf[18 + 20] == 0);  // echo reply
  CHECK(feed(s, ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 17, udp(1, 4791, 20), 0x4000, 100), o).l3_off == 18);
  NetStack untagged(host());
  CHECK(feed(untagged, arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kOurIp, 5), o).drop == Drop::VlanMismatch);
}

TEST_CASE("a reply that does not fit the caller's buffer is a counted drop") {
  NetStack s(host());
  uint8_t small[40];
  const Bytes f = arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kOurIp);
  const Result r = s.handle({f.data(), f.size()}, {small, sizeof small}, 0);
  CHECK(r.drop == Drop::ReplyNoRoom);
  CHECK(s.counters().drop(Drop::ReplyNoRoom) == 1);
  CHECK(std::string(drop_reason_name(Drop::ReplyNoRoom)) == "reply_no_room");
  CHECK(std::string(drop_reason_name(Drop::Ipv4BadSource)) == "ipv4_bad_source");
  CHECK(std::string(drop_reason_name(Drop::NdNotForUs)) == "nd_not_for_us");
}

TEST_CASE("the neighbour cache is fixed-size and evicts the oldest entry of a full bucket") {
  NeighConfig c;
  c.entries = 4;  // one bucket of 4 ways
  NeighCache n(c);
  for (uint32_t i = 0; i < 4; ++i) CHECK(n.confirm(wire::gid_from_ipv4(i + 1), kPeerMac, 10 + i, true));
  CHECK(n.used() == 4);
  CHECK(n.confirm(wire::gid_from_ipv4(99), kPeerMac, 100, true));
  CHECK(n.used() == 4);
  CHECK(n.evictions() == 1);
  CHECK(n.find(wire::gid_from_ipv4(1)) == nullptr);  // the least recently confirmed
  CHECK(n.find(wire::gid_from_ipv4(99)) != nullptr);
  CHECK(n.remove(wire::gid_from_ipv4(99)));
  CHECK_FALSE(n.remove(wire::gid_from_ipv4(99)));
  CHECK(n.entries().size() == 4);
}

TEST_CASE("every truncation of valid frames is handled without overreading") {
  NetStack s(host());
  Out o;
  const std::vector<Bytes> frames = {
      arp(kBcast, 1, kPeerMac, kPeerIp, kZeroMac, kOurIp),
      ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 1, icmp_echo(8, 1, 1, 30)),
      ipv6(kOurMac, kPeerMac, ip6("fd00:99::1"), ip6("fd00:99::2"), 58, icmp_echo(128, 1, 1, 30), 64),
      ipv6({0x33, 0x33, 0xff, 0, 0, 2}, kPeerMac, ip6("fd00:99::1"), ip6("ff02::1:ff00:2"), 58,
           nd(135, 0, ip6("fd00:99::2"), &kPeerMac)),
      ipv4(kOurMac, kPeerMac, kPeerIp, kOurIp, 17, udp(1, 4791, 30), 0x4000, 0),
  };
  uint64_t replies = 0;
  for (const auto& f : frames) {
    for (size_t len = 0; len < f.size(); ++len) {
      // A heap copy of exactly len bytes, so ASan catches any overread.
      std::vector<uint8_t> cut(f.begin(), f.begin() + static_cast<long>(len));
      const Result r = s.handle({cut.data(), cut.size()}, o.span(), 0);
      if (r.verdict == Verdict::Reply) {
        ++replies;
        CHECK(r.reply_len <= NetStack::kMaxReplyLen);
      }
    }
  }
  // No truncated frame gets an answer (ARP needs 28 bytes, IP frames check their lengths).
  CHECK(replies == 0);
  CHECK(s.counters().dropped() == s.counters().rx_frames - s.counters().roce);
}

TEST_CASE("resolving a multicast group: its MAC at once, no ARP or ND") {
  NetStack s(host());
  Out req;
  wire::MacAddr mac{};
  uint32_t len = 1;
  REQUIRE(s.resolve(wire::gid_from_ipv4(0xEF010101u), 0, mac, req.span(), len) == NetStack::Resolve::Ready);
  CHECK(mac == wire::MacAddr{0x01, 0x00, 0x5E, 0x01, 0x01, 0x01});
  CHECK(len == 0);
  wire::Gid v6{};
  v6[0] = 0xFF;
  v6[1] = 0x12;
  v6[15] = 0x07;
  REQUIRE(s.resolve(v6, 0, mac, req.span(), len) == NetStack::Resolve::Ready);
  CHECK(mac == wire::MacAddr{0x33, 0x33, 0, 0, 0, 0x07});
  CHECK(s.counters().arp_requests_sent == 0);
  CHECK(s.neighbours().find(wire::gid_from_ipv4(0xEF010101u)) == nullptr);
}
