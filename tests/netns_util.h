// Test helper: hosts made of Linux network namespaces joined by veth pairs to a bridge (its own
// namespace), with the link of each host under the test's control: down, up, or shaped with tc.
// Needs root and iproute2; CreateOrSayWhyNot() says why a test must be skipped otherwise. The
// namespaces are removed in the destructor, also when the test fails.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace st::testing {

inline std::string IpTool() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

inline std::string TcTool() {
  for (const char* p : {"/usr/sbin/tc", "/sbin/tc", "/usr/bin/tc", "/bin/tc"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

// Appends its arguments (GCC 12 reports a false -Wrestrict on `"literal" + std::string`).
template <typename... A>
std::string Cat(const A&... a) {
  std::string s;
  (s.append(a), ...);
  return s;
}

inline bool Sh(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0;
}

// "<tag>sw" holds the bridge, "<tag>h<i>" are the hosts at <subnet>.<i+1>/24, whose interface is
// "<tag>v<i>" (the bridge's end: "<tag>s<i>").
class Namespaces {
 public:
  Namespaces(std::string ip, int hosts, std::string subnet = "10.231.0")
      : ip_(std::move(ip)), subnet_(std::move(subnet)), hosts_(hosts) {
    tag_ = Cat("st", std::to_string(getpid() % 100000));
    Remove();
  }
  ~Namespaces() { Remove(); }
  Namespaces(const Namespaces&) = delete;
  Namespaces& operator=(const Namespaces&) = delete;

  std::string Host(int i) const { return Cat(tag_, "h", std::to_string(i)); }
  std::string Addr(int i) const { return Cat(subnet_, ".", std::to_string(i + 1)); }
  int hosts() const { return hosts_; }

  // Creates the namespaces; "" on success, else why the test must be skipped.
  std::string CreateOrSayWhyNot() {
    if (geteuid() != 0) return "needs root to create network namespaces";
    if (ip_.empty()) return "iproute2 `ip` not found";
    const std::string failed = Create();
    return failed.empty() ? "" : Cat("`ip netns` unavailable here: `", failed, "` failed");
  }

  // Host i's link to the bridge goes down (the host is cut off: packets are lost, connects fail
  // with "network unreachable" on its side) or comes back.
  bool LinkDown(int i) const {
    return Sh(Cat(ip_, " -n ", Host(i), " link set ", Veth(i), " down"));
  }
  bool LinkUp(int i) const { return Sh(Cat(ip_, " -n ", Host(i), " link set ", Veth(i), " up")); }
  // Host i sends at most `rate` (tc's syntax: "10mbit") through a token bucket.
  bool Shape(int i, const std::string& rate) const {
    const std::string tc = TcTool();
    return !tc.empty() && Sh(Cat(ip_, " netns exec ", Host(i), " ", tc, " qdisc add dev ", Veth(i),
                                 " root tbf rate ", rate, " burst 32kbit latency 400ms"));
  }
  // The pids of the processes still running in host i's namespace.
  std::vector<int> Pids(int i) const {
    std::vector<int> pids;
    FILE* f = popen(Cat(ip_, " netns pids ", Host(i), " 2>/dev/null").c_str(), "r");
    if (!f) return pids;
    int pid = 0;
    while (std::fscanf(f, "%d", &pid) == 1) pids.push_back(pid);
    pclose(f);
    return pids;
  }

 private:
  std::string Veth(int i) const { return Cat(tag_, "v", std::to_string(i)); }

  // Returns "" on success, else the command that failed.
  std::string Create() {
    const std::string sw = tag_ + "sw";
    std::vector<std::string> cmds = {ip_ + " netns add " + sw,
                                     ip_ + " -n " + sw + " link add br0 type bridge",
                                     ip_ + " -n " + sw + " link set br0 up"};
    for (int i = 0; i < hosts_; ++i) {
      const std::string h = Host(i), vh = Veth(i), vs = tag_ + "s" + std::to_string(i);
      for (const std::string& c :
           {ip_ + " netns add " + h, ip_ + " link add " + vh + " type veth peer name " + vs,
            ip_ + " link set " + vh + " netns " + h, ip_ + " link set " + vs + " netns " + sw,
            ip_ + " -n " + sw + " link set " + vs + " master br0",
            ip_ + " -n " + sw + " link set " + vs + " up",
            ip_ + " -n " + h + " addr add " + Addr(i) + "/24 dev " + vh,
            ip_ + " -n " + h + " link set " + vh + " up", ip_ + " -n " + h + " link set lo up"})
        cmds.push_back(c);
    }
    for (const auto& c : cmds)
      if (!Sh(c)) return c;
    return "";
  }

  void Remove() {
    for (int i = 0; i < hosts_; ++i) {
      Sh(ip_ + " netns del " + Host(i));
      Sh(ip_ + " link del " + Veth(i));  // if it never moved
    }
    Sh(ip_ + " netns del " + tag_ + "sw");
  }
  std::string ip_, subnet_, tag_;
  int hosts_;
};

}  // namespace st::testing
