// DCQCN reaction point arithmetic against sequences computed by hand from the
// rules in lib/transport/dcqcn.h (alpha reported and cut by in 1/1024 and kept
// in 1/2^20, rates in kb/s, integer division rounding down, the halfway step
// rounding up).
#include <catch2/catch.hpp>

#include "harness.h"
#include "transport/dcqcn.h"

using namespace droce;
using namespace droce::test;
using droce::transport::dcqcn::Params;
using droce::transport::dcqcn::ReactionPoint;

namespace {
Params small(uint32_t line_kbps) {
  Params p;  // NVIDIA's defaults but for the line rate and a short byte reset
  p.line_rate_kbps = line_kbps;
  p.byte_reset = 10'000;
  return p;
}
}  // namespace

TEST_CASE("dcqcn: first CNP cuts by alpha/2; alpha decays and a pending CNP waits for the monitor period") {
  ReactionPoint rp(small(100'000));
  CHECK_FALSE(rp.limited());
  CHECK(rp.next_send_ns() == 0);
  rp.on_cnp(0);
  // alpha 1023: cut min(511, 50% = 512) / 1024: 100000 - 100000*511/1024 = 100000 - 49902
  CHECK(rp.limited());
  CHECK(rp.current_kbps() == 50'098);
  CHECK(rp.target_kbps() == 100'000);
  CHECK(rp.alpha() == 1023);
  rp.advance(1'000);
  CHECK(rp.alpha() == 1018);  // 1019*1023*1024/1024 = 1018.005 of 1024
  rp.advance(2'000);
  CHECK(rp.alpha() == 1013);  // 1019*1018.005/1024 = 1013.034
  rp.on_cnp(2'500);           // inside the 4 us monitor period: no decrease yet
  CHECK(rp.current_kbps() == 50'098);
  CHECK(rp.counters().decreases == 1);
  rp.advance(3'000);
  CHECK(rp.alpha() == 1013);  // (1019*1013.034 + 5*1024)/1024 = 1013.088: the CNP raised it
  rp.advance(4'000);          // alpha 1019*1013.088/1024 = 1008.14, then the pending decrease
  CHECK(rp.alpha() == 1008);
  CHECK(rp.counters().decreases == 2);
  CHECK(rp.current_kbps() == 25'441);  // 50098 - 50098*504/1024
  CHECK(rp.target_kbps() == 100'000);  // no timer increase since: not clamped
  CHECK(rp.counters().cnps == 2);
}

TEST_CASE("dcqcn: the timer recovers fast; then additively; and the QP is unlimited again at line rate") {
  ReactionPoint rp(small(100'000));
  rp.on_cnp(0);
  rp.on_cnp(2'500);
  rp.advance(4'000);
  REQUIRE(rp.current_kbps() == 25'441);
  rp.advance(303'999);
  CHECK(rp.current_kbps() == 25'441);
  rp.advance(304'000);  // T=0: fast recovery, halfway to 100000 rounded up
  CHECK(rp.current_kbps() == 62'721);
  CHECK(rp.time_stage() == 1);
  // 300 decays from 1008.14: 1008.14 * (1019/1024)^300 = 232.3. Kept in whole
  // 1/1024 steps (rounding down every period) it was 163, and 0 by 604 us.
  CHECK(rp.alpha() == 232);
  rp.advance(604'000);  // T=1 >= threshold 1: additive (target already at line rate)
  CHECK(rp.current_kbps() == 81'361);
  CHECK(rp.target_kbps() == 100'000);
  CHECK(rp.alpha() == 53);  // 600 decays: 53.4
  // 90681, 95341, 97671, 98836, 99418, 99709, 99855, 99928, 99964, 99982,
  // 99991, 99996, 99998, 99999, 100000: 15 more timer periods.
  rp.advance(604'000 + 14 * 300'000);
  CHECK(rp.current_kbps() == 99'999);
  CHECK(rp.limited());
  rp.advance(604'000 + 15 * 300'000);
  CHECK(rp.current_kbps() == 100'000);
  CHECK_FALSE(rp.limited());
  CHECK(rp.next_send_ns() == 0);
  CHECK(rp.counters().increases == 17);
  CHECK(rp.counters().hyper == 0);
}

TEST_CASE("dcqcn: byte and timer stages; hyper increase once both pass the threshold") {
  ReactionPoint rp(small(1'000'000));
  rp.on_cnp(0);
  CHECK(rp.current_kbps() == 500'977);
  rp.on_cnp(10'000);  // alpha 974.0 after 10 decays; outside the monitor period: cut 487/1024
  CHECK(rp.alpha() == 974);
  CHECK(rp.current_kbps() == 262'720);  // 500977 - 500977*487/1024
  const uint32_t rc[] = {631'360, 815'680, 907'840};  // BC 0 fast recovery, then additive
  for (int i = 0; i < 3; ++i) {
    rp.on_sent(20'000 + i, 10'000);
    CHECK(rp.byte_stage() == uint32_t(i + 1));
    CHECK(rp.current_kbps() == rc[i]);
  }
  rp.advance(310'000);  // (T 0, BC 3): additive
  CHECK(rp.current_kbps() == 953'920);
  rp.advance(610'000);  // (1, 3): additive
  CHECK(rp.current_kbps() == 976'960);
  CHECK(rp.counters().hyper == 0);
  rp.on_sent(610'001, 10'000);  // (2, 3): both past 1: hyper
  CHECK(rp.counters().hyper == 1);
  CHECK(rp.current_kbps() == 988'480);
}

TEST_CASE("dcqcn: a CNP after a timer increase clamps the target; the pacer spaces packets at the current rate") {
  ReactionPoint rp(small(100'000));
  rp.on_cnp(0);
  rp.advance(300'000);  // fast recovery: 50098 -> 75049
  CHECK(rp.current_kbps() == 75'049);
  CHECK(rp.alpha() == 235);  // 1023 * (1019/1024)^300 = 235.3
  rp.on_cnp(300'500);  // target = 75049, current cut by 117/1024
  CHECK(rp.target_kbps() == 75'049);
  CHECK(rp.current_kbps() == 66'475);
  rp.advance(600'500);  // fast recovery toward the clamped target
  CHECK(rp.current_kbps() == 70'762);
  rp.advance(900'500);  // additive: target 80049
  CHECK(rp.target_kbps() == 80'049);
  CHECK(rp.current_kbps() == 75'406);
  // 1000 bytes at 75406 kb/s: 106092 ns; a bucket of 4096 bytes: 434554 ns.
  const uint64_t now = 2'000'000;
  rp.on_sent(now, 1000);  // a full bucket: the next may leave at once
  CHECK(rp.next_send_ns() == now - 434'554 + 106'092);
  for (int i = 0; i < 4; ++i) rp.on_sent(now, 1000);
  CHECK(rp.next_send_ns() == now - 434'554 + 5 * 106'092);
  CHECK(rp.next_send_ns() > now);  // the bucket is empty: the sixth waits
}

TEST_CASE("dcqcn: limits: min rate floor; bad parameters clamped; a long idle time is bounded work") {
  Params p = small(10'000);
  p.min_dec_fac_pct = 100;
  p.alpha_g = 2000;       // clamped to 1024: alpha never decays
  p.initial_alpha = 5000;  // clamped to 1024
  ReactionPoint rp(p);
  CHECK(rp.params().initial_alpha == 1024);
  CHECK(rp.params().alpha_g == 1024);
  rp.on_cnp(0);  // cut 512/1024
  CHECK(rp.current_kbps() == 5'000);
  for (uint64_t t = 4'000; t <= 40'000; t += 4'000) rp.on_cnp(t);
  CHECK(rp.current_kbps() == 1'000);  // 2500, 1250, then the min_rate floor
  CHECK(rp.counters().decreases == 11);
  rp.advance(uint64_t{1} << 50);      // years later: back at line rate, unlimited
  CHECK_FALSE(rp.limited());
  CHECK(rp.current_kbps() == 10'000);
}

TEST_CASE("dcqcn: NVIDIA's defaults; the byte counter at 32767 x 64 B; the decrease factor cap") {
  const Params d;
  CHECK(d.alpha_g == 1019);
  CHECK(d.initial_alpha == 1023);
  CHECK(d.alpha_update_period_ns == 1'000);
  CHECK(d.rate_reduce_monitor_period_ns == 4'000);
  CHECK(d.time_reset_ns == 300'000);
  CHECK(d.byte_reset == 32767ull * 64);
  CHECK(d.threshold == 1);
  CHECK(d.ai_rate_kbps == 5'000);
  CHECK(d.hai_rate_kbps == 50'000);
  CHECK(d.min_rate_kbps == 1'000);
  CHECK(d.min_dec_fac_pct == 50);
  CHECK(d.rate_to_set_on_first_cnp_kbps == 0);
  CHECK_FALSE(d.clamp_tgt_rate);
  CHECK(d.clamp_tgt_rate_after_time_inc);
  Params p;
  p.line_rate_kbps = 10'000'000;  // 10 Gb/s
  ReactionPoint rp(p);
  rp.on_cnp(0);  // 10000000 - 10000000*511/1024
  CHECK(rp.current_kbps() == 5'009'766);
  rp.on_sent(1'000, 32767 * 64 - 1);  // one byte short of the byte reset
  CHECK(rp.byte_stage() == 0);
  CHECK(rp.counters().increases == 0);
  rp.on_sent(1'001, 1);  // the byte reset: fast recovery, halfway to 10000000
  CHECK(rp.byte_stage() == 1);
  CHECK(rp.current_kbps() == 7'504'883);
  CHECK(rp.target_kbps() == 10'000'000);
  // A cap of 25%: the first cut is 256/1024 whatever alpha says (511).
  p.min_dec_fac_pct = 25;
  ReactionPoint capped(p);
  capped.on_cnp(0);
  CHECK(capped.current_kbps() == 7'500'000);
}

TEST_CASE("dcqcn: below the line rate the target moves by AI 5 Mb/s and HAI 50 Mb/s; F stages of fast recovery") {
  Params p;
  p.line_rate_kbps = 10'000'000;
  p.clamp_tgt_rate = true;  // every decrease sets the target to the current rate (the paper's rule)
  ReactionPoint rp(p);
  rp.on_cnp(0);
  rp.on_cnp(4'000);  // alpha 1003 after 4 decays; target = 5009766, cut 501/1024
  CHECK(rp.alpha() == 1003);
  CHECK(rp.target_kbps() == 5'009'766);
  CHECK(rp.current_kbps() == 2'558'699);
  constexpr uint64_t kReset = 32767 * 64;
  rp.on_sent(5'000, kReset);  // (T 0, BC 0): fast recovery, target unchanged
  CHECK(rp.target_kbps() == 5'009'766);
  CHECK(rp.current_kbps() == 3'784'233);
  rp.on_sent(6'000, kReset);  // (0, 1): additive
  CHECK(rp.target_kbps() == 5'014'766);
  CHECK(rp.current_kbps() == 4'399'500);
  rp.on_sent(7'000, kReset);  // (0, 2): additive
  CHECK(rp.target_kbps() == 5'019'766);
  CHECK(rp.current_kbps() == 4'709'633);
  rp.advance(303'999);
  CHECK(rp.time_stage() == 0);
  rp.advance(304'000);  // 300 us after the decrease, (0, 3): additive
  CHECK(rp.time_stage() == 1);
  CHECK(rp.target_kbps() == 5'024'766);
  CHECK(rp.current_kbps() == 4'867'200);
  rp.advance(604'000);  // (1, 3): additive
  CHECK(rp.target_kbps() == 5'029'766);
  CHECK(rp.current_kbps() == 4'948'483);
  CHECK(rp.counters().hyper == 0);
  rp.on_sent(604'001, kReset);  // (2, 3): both past the threshold: hyper
  CHECK(rp.target_kbps() == 5'079'766);
  CHECK(rp.current_kbps() == 5'014'125);
  CHECK(rp.counters().hyper == 1);
  CHECK(rp.counters().increases == 6);

  // Threshold F = 3: three byte stages of fast recovery (target kept), then additive.
  Params f;
  f.line_rate_kbps = 10'000'000;
  f.threshold = 3;
  ReactionPoint fr(f);
  fr.on_cnp(0);
  const uint32_t want[] = {7'504'883, 8'752'442, 9'376'221, 9'688'111};
  for (int i = 0; i < 4; ++i) {
    fr.on_sent(1'000 + i, kReset);
    CHECK(fr.current_kbps() == want[i]);
    CHECK(fr.target_kbps() == 10'000'000);
  }
}

TEST_CASE("dcqcn: the pacer's wait follows the rate: an increase shortens what a slow rate had scheduled") {
  Params p;
  p.line_rate_kbps = 100'000;
  ReactionPoint rp(p);
  rp.on_cnp(0);
  REQUIRE(rp.current_kbps() == 50'098);
  // 1000 bytes at 50098 kb/s: 159687 ns each; ten sent at once owe 1596870 ns.
  for (int i = 0; i < 10; ++i) rp.on_sent(0, 1000);
  CHECK(rp.next_send_ns() == 1'596'870);
  // At 300 us the timer's fast recovery raises the rate to 75049 kb/s: the
  // 1296870 ns still owed shrink by 50098/75049.
  rp.advance(300'000);
  CHECK(rp.current_kbps() == 75'049);
  CHECK(rp.next_send_ns() == 300'000 + 1'296'870ull * 50'098 / 75'049);
  CHECK(rp.next_send_ns() == 1'165'708);
}

namespace {
struct Run {
  uint64_t virtual_ns = 0;
  uint64_t cnps = 0, decreases = 0, paced = 0;
  uint32_t rate_kbps = 0;
  bool data_ok = false;
};
// A 1 MiB RC WRITE from A to B, every frame from A CE-marked, on the virtual clock.
Run marked_write(bool dcqcn) {
  EngineConfig cfg;
  cfg.dcqcn = dcqcn;
  cfg.dcqcn_params.line_rate_kbps = 10'000'000;  // 10 Gb/s
  cfg.cnp_interval_ns = 4'000;                   // NVIDIA's min_time_between_cnps
  World w(11, 2, cfg);
  memlink::Faults f;
  f.ce_mark = 1.0;
  w.node[0]->port.set_faults(f);
  auto [qa, qb] = w.connect(0, 1, QpType::RC);
  Node& A = *w.node[0];
  const uint64_t t0 = w.clock.now_ns();
  const PostedWrite pw = post_write(A, *w.node[1], qa, 1 << 20, 5);
  auto wcs = wait_wcs(w, A, A.scq, 1);
  Run r;
  r.virtual_ns = w.clock.now_ns() - t0;
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].status == WcStatus::Success);
  r.data_ok = pw.data_ok();
  const transport::Qp* q = A.eng->qp(qa);
  r.cnps = q->ctr.cnp_received;
  r.decreases = q->rp.counters().decreases;
  r.paced = q->ctr.paced;
  r.rate_kbps = q->rp.current_kbps();
  return r;
}
}  // namespace

TEST_CASE("dcqcn: stall_hold_ns: a gap past it between calls is not time; a shorter one is") {
  Params p = small(100'000);
  p.stall_hold_ns = 1'000'000;  // 1 ms
  ReactionPoint held(p);
  held.on_cnp(0);  // 100000 - 100000*511/1024 = 50098; the timer is due at 300 us
  REQUIRE(held.current_kbps() == 50'098);
  held.advance(100'000);
  const uint32_t alpha = held.alpha();
  CHECK(alpha < 1023);
  held.advance(20'100'000);  // 20 ms without a call: held, every clock moves by 20 ms
  CHECK(held.counters().stalls == 1);
  CHECK(held.counters().increases == 0);
  CHECK(held.current_kbps() == 50'098);
  CHECK(held.alpha() == alpha);
  CHECK(held.limited());
  held.advance(20'300'000);  // the timer, 300 us of counted time after the CNP: halfway to 100000, rounded up
  CHECK(held.counters().increases == 1);
  CHECK(held.current_kbps() == 75'049);

  // A gap under the hold counts: timer events at 300, 600 and 900 us.
  ReactionPoint short_gap(p);
  short_gap.on_cnp(0);
  short_gap.advance(100'000);
  short_gap.advance(1'000'000);
  CHECK(short_gap.counters().stalls == 0);
  CHECK(short_gap.counters().increases == 3);

  // Without the hold (NVIDIA's behaviour, the default) the 20 ms run the
  // timer's recovery all the way back to the line rate.
  ReactionPoint counted(small(100'000));
  counted.on_cnp(0);
  counted.advance(100'000);
  counted.advance(20'100'000);
  CHECK(counted.counters().stalls == 0);
  CHECK(counted.current_kbps() == 100'000);
  CHECK_FALSE(counted.limited());
}

TEST_CASE("dcqcn: validate_rate: the timer raises only a rate the pacer held the QP to") {
  Params p = small(100'000);
  p.validate_rate = true;
  ReactionPoint rp(p);
  rp.on_cnp(0);  // 50098; the timer is due at 300, 600, 900 us
  REQUIRE(rp.current_kbps() == 50'098);
  rp.advance(300'000);  // not held since the decrease: no increase
  CHECK(rp.counters().increases == 0);
  CHECK(rp.counters().unused == 1);
  CHECK(rp.current_kbps() == 50'098);
  rp.on_paced();
  rp.advance(600'000);  // held: fast recovery halfway to 100000, rounded up
  CHECK(rp.counters().increases == 1);
  CHECK(rp.current_kbps() == 75'049);
  rp.advance(900'000);  // each increase needs its own hold
  CHECK(rp.counters().increases == 1);
  CHECK(rp.counters().unused == 2);

  ReactionPoint always(small(100'000));  // the default: every timer event counts
  always.on_cnp(0);
  always.advance(300'000);
  CHECK(always.counters().increases == 1);
  CHECK(always.counters().unused == 0);
  CHECK(always.current_kbps() == 75'049);
}

TEST_CASE("dcqcn: window_ns: a limited QP's bytes in flight are its rate x window_ns") {
  Params p = small(100'000);
  p.window_ns = 1'000'000;  // 1 ms
  ReactionPoint rp(p);
  CHECK(rp.window_bytes() == 0);  // not limited: no bound
  rp.on_cnp(0);
  REQUIRE(rp.current_kbps() == 50'098);
  CHECK(rp.window_bytes() == 6'262);  // 50098 kb/s x 1 ms / 8 = 6262.25 bytes
  rp.advance(300'000);  // fast recovery to 75049 kb/s
  CHECK(rp.window_bytes() == 9'381);
  ReactionPoint off(small(100'000));  // window_ns 0: no bound at any rate
  off.on_cnp(0);
  CHECK(off.window_bytes() == 0);
}

TEST_CASE("dcqcn: CNPs slow a marked RC sender end to end; without DCQCN they are only counted") {
  const Run off = marked_write(false);
  const Run on = marked_write(true);
  INFO("off: " << off.virtual_ns << " ns, on: " << on.virtual_ns << " ns, rate " << on.rate_kbps << " kb/s, "
               << on.decreases << " decreases, " << on.paced << " paced turns");
  CHECK(off.data_ok);
  CHECK(on.data_ok);
  CHECK(off.cnps > 0);
  CHECK(off.decreases == 0);
  CHECK(off.paced == 0);
  CHECK(on.cnps > 0);
  CHECK(on.decreases > 0);
  CHECK(on.decreases <= on.cnps);
  CHECK(on.paced > 0);
  CHECK(on.rate_kbps < 10'000'000 / 2);
  // 1 MiB never goes faster than the highest rate DCQCN allowed: at least
  // 8 Mbit / 10 Gb/s, and it is held well below that.
  CHECK(on.virtual_ns > 2 * off.virtual_ns);
  CHECK(on.virtual_ns > 8 * (1u << 20) / 10);
}
