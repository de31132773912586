// droce-embed-example: a toy storage target and its initiator, each an
// embedded droce node (lib/engine/embed.h) on its own DPDK port, both driven
// from this program's single poll loop (no threads). The target exposes a
// "disk" (hugepage memory, registered for remote access). The initiator writes
// blocks with RDMA WRITE, then sends a COMMIT (SEND) naming the block and its
// checksum; the target checks the block in its disk and answers with a status
// SEND. Finally the initiator reads every block back with RDMA READ and compares.
//
//   droce-embed-example --target-device net_af_packet0,iface=vb --target-ip 10.40.0.2
//                       --initiator-device net_af_packet1,iface=va --initiator-ip 10.40.0.1
//                       [--blocks 64] [--block-size 4096] -- EAL args
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "engine/embed.h"

using namespace droce;

namespace {

struct Commit {
  uint32_t block;
  uint32_t sum;
};

uint32_t checksum(const uint8_t* p, size_t n) {
  uint32_t a = 1, b = 0;  // Adler-32
  for (size_t i = 0; i < n; ++i) {
    a = (a + p[i]) % 65521;
    b = (b + a) % 65521;
  }
  return b << 16 | a;
}

// Polls both nodes until cq yields one completion (bounded).
verbs::Wc wait_wc(engine::Embedded& x, engine::Embedded& y, verbs::Cq* cq) {
  verbs::Wc wc;
  for (uint64_t i = 0; i < 50'000'000; ++i) {
    x.poll();
    y.poll();
    if (cq->poll(&wc, 1) == 1) {
      if (wc.status != verbs::WcStatus::Success)
        throw std::runtime_error(std::string("completion error: ") + verbs::wc_status_str(wc.status));
      return wc;
    }
  }
  throw std::runtime_error("timed out waiting for a completion");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> eal;
  const int own = engine::split_eal_args(argc, argv, eal);
  std::string tdev, tip, idev, iip;
  uint32_t blocks = 64, bsize = 4096;
  CLI::App app{"droce-embed-example: toy RDMA storage target + initiator on the embedding API"};
  app.add_option("--target-device", tdev, "DPDK device of the target")->required();
  app.add_option("--target-ip", tip, "IPv4 address of the target")->required();
  app.add_option("--initiator-device", idev, "DPDK device of the initiator")->required();
  app.add_option("--initiator-ip", iip, "IPv4 address of the initiator")->required();
  app.add_option("--blocks", blocks, "blocks on the disk")->check(CLI::Range(1, 4096));
  app.add_option("--block-size", bsize, "bytes per block")->check(CLI::Range(64, 1 << 20));
  try {
    app.parse(own, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    engine::EmbedOptions to;
    to.device = tdev;
    to.ipv4 = {tip};
    to.eal_args = eal;
    engine::Embedded target(to);
    engine::EmbedOptions io = to;
    io.device = idev;
    io.ipv4 = {iip};
    io.init_eal = false;  // one EAL per process: the target's
    engine::Embedded init(io);

    const size_t disk_len = size_t{blocks} * bsize;
    auto* disk = static_cast<uint8_t*>(target.alloc_dma(disk_len));
    auto* tmsg = static_cast<uint8_t*>(target.alloc_dma(4096));
    auto* buf = static_cast<uint8_t*>(init.alloc_dma(disk_len));
    auto* imsg = static_cast<uint8_t*>(init.alloc_dma(4096));
    if (!disk || !tmsg || !buf || !imsg) throw std::runtime_error("no hugepage memory");
    std::memset(disk, 0, disk_len);
    const uint32_t tpd = target.alloc_pd(), ipd = init.alloc_pd();
    uint32_t disk_key, tmsg_key, buf_key, imsg_key;
    if (target.reg_mr(tpd, disk, disk_len, verbs::kAccessAll, &disk_key) ||
        target.reg_mr(tpd, tmsg, 4096, verbs::kAccessLocalWrite, &tmsg_key) ||
        init.reg_mr(ipd, buf, disk_len, verbs::kAccessLocalWrite, &buf_key) ||
        init.reg_mr(ipd, imsg, 4096, verbs::kAccessLocalWrite, &imsg_key))
      throw std::runtime_error("reg_mr failed");
    engine::QpOptions qo;
    qo.psn = 100;
    engine::QpHandle tq = target.create_qp(tpd, qo);
    qo.psn = 900;
    engine::QpHandle iq = init.create_qp(ipd, qo);
    // Out-of-band exchange (in-process here): QPN, PSN, GID; MACs by ARP.
    if (int rc = target.connect(tq, {iq.qpn, 900, init.gid(1), {}})) throw std::runtime_error("target connect " + std::to_string(rc));
    if (int rc = init.connect(iq, {tq.qpn, 100, target.gid(1), {}})) throw std::runtime_error("initiator connect " + std::to_string(rc));
    std::printf("target qpn %u disk %u x %u B (iova 0x%lx), initiator qpn %u\n", tq.qpn, blocks, bsize,
                static_cast<unsigned long>(target.dataplane().mrs().front().dma_iova), iq.qpn);

    auto post_recv = [](engine::Embedded& n, engine::QpHandle& q, uint8_t* p, uint32_t key) {
      verbs::RecvWr r;
      r.num_sge = 1;
      r.sg_list[0] = {reinterpret_cast<uint64_t>(p), 64, key};
      if (n.post_recv(q, r)) throw std::runtime_error("post_recv");
    };
    auto send = [](engine::Embedded& n, engine::QpHandle& q, uint8_t* p, uint32_t len, uint32_t key) {
      verbs::SendWr w;
      w.opcode = verbs::WrOpcode::Send;
      w.num_sge = 1;
      w.sg_list[0] = {reinterpret_cast<uint64_t>(p), len, key};
      if (n.post_send(q, w)) throw std::runtime_error("post_send");
    };
    uint32_t bad = 0;
    for (uint32_t blk = 0; blk < blocks; ++blk) {
      uint8_t* src = buf + size_t{blk} * bsize;
      for (uint32_t i = 0; i < bsize; ++i) src[i] = static_cast<uint8_t>(blk * 131 + i * 7 + (i >> 9));
      post_recv(target, tq, tmsg, tmsg_key);
      post_recv(init, iq, imsg, imsg_key);
      verbs::SendWr w;  // WRITE the block into the target's disk
      w.opcode = verbs::WrOpcode::RdmaWrite;
      w.num_sge = 1;
      w.sg_list[0] = {reinterpret_cast<uint64_t>(src), bsize, buf_key};
      w.rdma.remote_addr = reinterpret_cast<uint64_t>(disk) + uint64_t{blk} * bsize;
      w.rdma.rkey = disk_key;
      if (init.post_send(iq, w)) throw std::runtime_error("post WRITE");
      wait_wc(init, target, iq.scq);
      Commit c{blk, checksum(src, bsize)};
      std::memcpy(imsg + 64, &c, sizeof c);
      send(init, iq, imsg + 64, sizeof c, imsg_key);
      wait_wc(init, target, iq.scq);
      // Target: the COMMIT arrives; check the block in the disk; answer.
      wait_wc(target, init, tq.rcq);
      Commit got;
      std::memcpy(&got, tmsg, sizeof got);
      const uint32_t status = got.block < blocks && checksum(disk + size_t{got.block} * bsize, bsize) == got.sum ? 0 : 1;
      std::memcpy(tmsg + 64, &status, 4);
      send(target, tq, tmsg + 64, 4, tmsg_key);
      wait_wc(target, init, tq.scq);
      wait_wc(init, target, iq.rcq);
      uint32_t st;
      std::memcpy(&st, imsg, 4);
      if (st != 0) ++bad;
    }
    // Read everything back and compare.
    std::vector<uint8_t> expect(buf, buf + disk_len);
    std::memset(buf, 0, disk_len);
    for (uint32_t blk = 0; blk < blocks; ++blk) {
      verbs::SendWr w;
      w.opcode = verbs::WrOpcode::RdmaRead;
      w.num_sge = 1;
      w.sg_list[0] = {reinterpret_cast<uint64_t>(buf + size_t{blk} * bsize), bsize, buf_key};
      w.rdma.remote_addr = reinterpret_cast<uint64_t>(disk) + uint64_t{blk} * bsize;
      w.rdma.rkey = disk_key;
      if (init.post_send(iq, w)) throw std::runtime_error("post READ");
      wait_wc(init, target, iq.scq);
    }
    const bool same = std::memcmp(buf, expect.data(), disk_len) == 0;
    std::printf("wrote %u blocks: %u commit(s) rejected; read back: %s\n", blocks, bad, same ? "identical" : "DIFFERENT");
    target.dataplane().stop();
    init.dataplane().stop();
    return bad == 0 && same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "droce-embed-example: %s\n", e.what());
    return 1;
  }
}
