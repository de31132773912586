// The host side of the lib/nvmf Queue tests without RDMA: host memory as
// regions by rkey (a region's address is key << 32), the command capsules it
// sends, and the RDMA actions of a Queue carried out on that memory. Used by
// test_queue.cc and test_file_backend.cc.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "nvmf/queue.h"

namespace droce::nvmf::testing {

struct HostMemory {
  std::map<uint32_t, std::vector<uint8_t>> mem;
  uint16_t next_cid = 0;

  // A new region holding bytes; returns its rkey.
  uint32_t region(std::vector<uint8_t> bytes) {
    const uint32_t key = static_cast<uint32_t>(mem.size() + 1) * 0x100 + 0x11;
    mem[key] = std::move(bytes);
    return key;
  }
  // len bytes at addr in region key (REQUIREs that they lie inside it).
  uint8_t* at(uint64_t addr, uint32_t key, uint32_t len) {
    auto& m = mem.at(key);
    const uint64_t off = addr - (uint64_t{key} << 32);
    REQUIRE(off + len <= m.size());
    return m.data() + off;
  }
  // The capsule of s (SGL descriptors in the SQE) with in-capsule data icd.
  static std::vector<uint8_t> capsule(Sqe s, std::span<const uint8_t> icd = {}) {
    s.flags = 0x40;
    std::vector<uint8_t> b(64 + icd.size());
    encode_sqe(std::span<uint8_t, 64>(b.data(), 64), s);
    if (!icd.empty()) std::memcpy(b.data() + 64, icd.data(), icd.size());
    return b;
  }
  // A command with the next cid and no data: a null keyed SGL, as Linux sends.
  Sqe cmd(uint8_t op, uint32_t nsid = 0) {
    Sqe s;
    s.opcode = op;
    s.cid = ++next_cid;
    s.nsid = nsid;
    encode_sgl(s.dptr, Sgl{SglKind::Keyed, 0, 0, 0});
    return s;
  }
  // Points s's data at the whole of region key (len bytes), to be invalidated when inv.
  static void keyed(Sqe& s, uint32_t key, uint32_t len, bool inv = false) {
    encode_sgl(s.dptr, Sgl{inv ? SglKind::KeyedInvalidate : SglKind::Keyed, uint64_t{key} << 32, len, key});
  }
  // Carries out one action of q as the RDMA hardware would: a READ copies
  // from host memory and completes, a WRITE copies into it, a SEND (the
  // response) completes and its CQE is returned.
  std::optional<Cqe> carry_out(Queue& q, const Action& a, uint64_t now) {
    switch (a.kind) {
      case Action::RdmaRead:
        std::memcpy(a.local, at(a.remote_addr, a.rkey, a.len), a.len);
        q.on_complete(a.slot, Action::RdmaRead, true, now);
        return std::nullopt;
      case Action::RdmaWrite:
        std::memcpy(at(a.remote_addr, a.rkey, a.len), a.local, a.len);
        return std::nullopt;
      case Action::Send: {
        REQUIRE(a.len == 16);
        Cqe c;
        decode_cqe(std::span<const uint8_t, 16>(a.local, 16), c);
        q.on_complete(a.slot, Action::Send, true, now);
        return c;
      }
    }
    FAIL("unknown action kind " << static_cast<int>(a.kind));
    return std::nullopt;
  }
};

}  // namespace droce::nvmf::testing
