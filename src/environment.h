// The runtime's on/off switches read from the environment (OPFORGE_AMX, OPFORGE_BF16_DOT,
// OPFORGE_FOREIGN_POOL, ...): one spelling for all of them, "0"/"off" and "1"/"on".
#pragma once

#include <cstdlib>
#include <cstring>

namespace opforge {

inline bool turned_off_by_environment(const char* variable) {
  const char* env = std::getenv(variable);
  return env && (std::strcmp(env, "0") == 0 || std::strcmp(env, "off") == 0);
}

inline bool turned_on_by_environment(const char* variable) {
  const char* env = std::getenv(variable);
  return env && (std::strcmp(env, "1") == 0 || std::strcmp(env, "on") == 0);
}

}  // namespace opforge
