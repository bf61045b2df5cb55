// Small string helpers shared by the file-name and flag-value checks.
#pragma once
#include <algorithm>
#include <cctype>
#include <string>

namespace sd {

// ASCII lower case: file extensions and scheduler names compare case-insensitively ("IMG.JPG", "EulerA").
inline std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace sd
