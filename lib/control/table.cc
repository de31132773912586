#include "control/table.h"

#include <algorithm>

namespace droce::control {
namespace {

using json = nlohmann::ordered_json;

bool numeric(const std::string& s) {
  if (s.empty()) return false;
  size_t i = (s[0] == '-') ? 1 : 0;
  if (i == s.size()) return false;
  bool dot = false;
  for (; i < s.size(); ++i) {
    if (s[i] == '.' && !dot) {
      dot = true;
    } else if (s[i] < '0' || s[i] > '9') {
      return false;
    }
  }
  return true;
}

void flatten(const json& v, const std::string& prefix, std::vector<std::vector<std::string>>& rows) {
  if (v.is_object() && !v.empty()) {
    for (const auto& [k, e] : v.items()) {
      std::string key = prefix;
      if (!key.empty()) key += '.';
      key += k;
      flatten(e, key, rows);
    }
  } else {
    rows.push_back({prefix, cell_text(v)});
  }
}

std::string objects_table(const json& arr) {
  std::vector<std::string> cols;
  for (const json& o : arr) {
    for (const auto& [k, e] : o.items()) {
      if (std::find(cols.begin(), cols.end(), k) == cols.end()) cols.push_back(k);
    }
  }
  std::vector<std::vector<std::string>> rows;
  for (const json& o : arr) {
    std::vector<std::string> r;
    for (const std::string& c : cols) r.push_back(o.contains(c) ? cell_text(o[c]) : "");
    rows.push_back(std::move(r));
  }
  return render_table(cols, rows);
}

bool array_of_objects(const json& v) {
  return v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_object(); });
}

}  // namespace

std::string cell_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  if (v.is_array()) {
    std::string out;
    for (const json& e : v) {
      if (!out.empty()) out += ',';
      out += cell_text(e);
    }
    return out;
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string render_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(header.size());
  for (size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  }
  std::vector<bool> right(header.size(), true);
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size() && i < right.size(); ++i) right[i] = right[i] && (r[i].empty() || numeric(r[i]));
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string l;
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string c = i < cells.size() ? cells[i] : "";
      std::string pad(w[i] - std::min(w[i], c.size()), ' ');
      if (i) l += "  ";
      if (right[i] && !rows.empty()) {
        l += pad;
        l += c;
      } else {
        l += c;
        l += pad;
      }
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    out += l + "\n";
  };
  std::vector<std::string> upper;
  for (const auto& h : header) {
    std::string u = h;
    std::transform(u.begin(), u.end(), u.begin(), ::toupper);
    upper.push_back(u);
  }
  line(upper);
  for (const auto& r : rows) line(r);
  return out;
}

std::string render_result(const json& result) {
  if (result.is_object() && result.contains("groups") && result["groups"].is_array()) {
    // With per-core values: a CORE column, "all" for the sum.
    bool per_core = false;
    for (const json& g : result["groups"]) {
      for (const json& inst : g.value("instances", json::array())) per_core = per_core || inst.contains("per_core");
    }
    std::vector<std::vector<std::string>> rows;
    for (const json& g : result["groups"]) {
      const json& names = g.value("names", json::array());
      const std::string group = cell_text(g.value("group", json("?")));
      for (const json& inst : g.value("instances", json::array())) {
        const std::string name = cell_text(inst.value("name", json("?")));
        auto add_rows = [&](const std::string& core, const json& vals) {
          for (size_t i = 0; i < names.size() && i < vals.size(); ++i) {
            if (per_core) {
              rows.push_back({group, name, core, cell_text(names[i]), cell_text(vals[i])});
            } else {
              rows.push_back({group, name, cell_text(names[i]), cell_text(vals[i])});
            }
          }
        };
        add_rows("all", inst.value("values", json::array()));
        if (per_core && inst.contains("per_core") && inst["per_core"].size() > 1) {
          for (const json& sh : inst["per_core"]) add_rows(cell_text(sh.value("core", json("?"))), sh.value("values", json::array()));
        }
      }
    }
    if (per_core) return render_table({"group", "instance", "core", "counter", "value"}, rows);
    return render_table({"group", "instance", "counter", "value"}, rows);
  }
  if (array_of_objects(result)) return objects_table(result);
  if (result.is_array() && result.empty()) return "(none)\n";
  if (result.is_object()) {
    const json* only = nullptr;
    size_t arrays = 0;
    for (const auto& [k, e] : result.items()) {
      if (e.is_array()) {
        ++arrays;
        only = &e;
      }
    }
    if (arrays == 1 && result.size() == 1) {
      if (array_of_objects(*only)) return objects_table(*only);
      if (only->empty()) return "(none)\n";
    }
    // Scalars and nested objects as KEY VALUE rows; arrays of objects as
    // their own tables after them.
    std::vector<std::vector<std::string>> rows;
    std::string sections;
    for (const auto& [k, e] : result.items()) {
      if (array_of_objects(e)) {
        sections += "\n" + k + ":\n" + objects_table(e);
      } else {
        flatten(e, k, rows);
      }
    }
    return (rows.empty() ? std::string() : render_table({"key", "value"}, rows)) + sections;
  }
  return cell_text(result) + "\n";
}

}  // namespace droce::control
