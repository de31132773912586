// droce/control: plain-text tables for droce-ctl.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace droce::control {

// Columns padded to their widest cell; cells that look numeric are right-aligned.
std::string render_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

// Any command result as a table:
//  - {"groups": [...]} from `counters`: one row per (group, instance, counter);
//  - an array of objects: one row each, columns = keys in first-seen order;
//  - an object whose single array member is an array of objects: that array;
//  - any other object: KEY VALUE rows, nested objects flattened as a.b.c,
//    then each member that is an array of objects as its own table.
std::string render_result(const nlohmann::ordered_json& result);

// A scalar as table text (strings unquoted, arrays as a,b,c).
std::string cell_text(const nlohmann::ordered_json& v);

}  // namespace droce::control
