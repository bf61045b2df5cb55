// Runs a function on N ranks as N threads of this process, each with a real c10d/Gloo communicator on loopback.
#pragma once
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "dist/store_listen.h"

namespace sd::dist::testing {

inline DistEnv loopback_env(int rank, int world, int port) {
  DistEnv env;
  env.rank = rank;
  env.world_size = world;
  env.local_rank = rank;
  env.local_world_size = world;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  env.launcher = "test";
  return env;
}

// Runs fn(rank, comm) on every rank; returns each rank's error message ("" if none).
inline std::vector<std::string> run_world(int world, const std::function<void(int, Communicator&)>& fn,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(20),
                                          const std::string& transport = "auto") {
  const int port = find_free_port();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommOptions opts;
        opts.timeout = timeout;
        opts.transport = transport;
        auto comm = make_communicator(loopback_env(r, world, port), opts);
        fn(r, *comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace sd::dist::testing
