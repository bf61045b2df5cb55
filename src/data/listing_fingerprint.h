#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace sd::data {

// A digest (16 hex digits, FNV-1a) of a data listing: each file's name and size, in order. Two machines holding the
// same copy of the data under different mount points agree; a missing, extra or different-sized file changes it.
std::string listing_fingerprint(const std::vector<std::filesystem::path>& files);

// The same digest of a list of strings (sample names, weight samples), each in order.
std::string text_fingerprint(const std::vector<std::string>& items);

}  // namespace sd::data
