# ActiveJob against plain Sidekiq jobs, for wasmjobs and for Ruby Sidekiq,
# in one run on one machine (scripts/bench-activejob.sh runs it).
#
# Each case pushes N noop jobs into a fresh Redis, then starts its
# consumer and measures the rate at which it takes them from the queue,
# from the first job taken to the last (so start-up, plugin compilation
# and Ruby's boot are left out alike):
#
#   wasm-plain   {"class":"NoopJob",...}                 wasmjobs run, NoopJob plugin
#   wasm-aj      the ActiveJob wrapper of NoopJob         wasmjobs run, the same plugin
#   ruby-native  {"class":"NoopJob",...}                 sidekiq, a Sidekiq::Job NoopJob
#   ruby-aj      the ActiveJob wrapper of NoopJob         sidekiq, an ActiveJob NoopJob
#
# The wrappers are what Rails writes: ActiveJob's own `serialize` of a
# NoopJob (Debian 12: Rails 6.1, Sidekiq 6.4), pushed as its Sidekiq
# adapter pushes them. Rounds alternate the cases; the report gives each
# case's rate per round and the ratios within each round.
#
# Usage: ruby bench.rb WASMJOBS_BIN PLUGINS_DIR [N] [ROUNDS] [CONCURRENCY]

require "json"
require "socket"
require "tmpdir"
require "sidekiq"
require "sidekiq/api"
require "active_job"

wasmjobs, plugins = ARGV[0], ARGV[1]
abort "usage: ruby bench.rb WASMJOBS_BIN PLUGINS_DIR [N] [ROUNDS] [CONCURRENCY]" unless wasmjobs && plugins
n = Integer(ARGV[2] || 100_000)
rounds = Integer(ARGV[3] || 3)
concurrency = Integer(ARGV[4] || 10)

port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
url = "redis://127.0.0.1:#{port}/0"
dir = Dir.mktmpdir("wasmjobs-aj-bench")
redis_pid = spawn("redis-server", "--port", port.to_s, "--save", "", "--appendonly", "no", "--dir", dir,
                  out: File::NULL, err: File::NULL)
at_exit { Process.kill("TERM", redis_pid) rescue nil }

Sidekiq.configure_client { |c| c.redis = { url: url } }
Sidekiq.logger = Logger.new(nil)
ActiveJob::Base.queue_adapter = :sidekiq
ActiveJob::Base.logger = Logger.new(nil)
class NoopJob < ActiveJob::Base
  queue_as :default
  def perform(*); end
end

worker = File.join(dir, "worker.rb")
File.write(worker, <<~RUBY)
  require "active_job"
  ActiveJob::Base.queue_adapter = :sidekiq
  ActiveJob::Base.logger = Logger.new(nil)
  class NoopJob
    include Sidekiq::Worker
    def perform(*) = nil
  end
  class NoopActiveJob < ActiveJob::Base
    def perform(*) = nil
  end
RUBY

def redis
  Sidekiq.redis { |c| yield c }
end

def wait_ready(port)
  200.times do
    return if (TCPSocket.new("127.0.0.1", port).close rescue false) != false
    sleep 0.05
  end
  abort "redis-server did not start"
end
wait_ready(port)

# Pushes n jobs: plain payloads, or ActiveJob wrappers of `klass`; with
# `same_size`, plain payloads whose one argument is the ActiveJob hash (as
# large as a wrapper, nothing to unwrap).
def push(n, activejob:, klass: "NoopJob", same_size: false)
  redis(&:flushdb)
  wrapper = "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper"
  n.times.each_slice(1_000) do |slice|
    if activejob
      hashes = slice.map { |i| NoopJob.new(i).serialize.merge("job_class" => klass) }
      Sidekiq::Client.push_bulk("class" => wrapper, "wrapped" => klass, "queue" => "default",
                                "args" => hashes.map { |h| [h] })
    elsif same_size
      hashes = slice.map { |i| NoopJob.new(i).serialize }
      Sidekiq::Client.push_bulk("class" => "NoopJob", "queue" => "default", "args" => hashes.map { |h| [h] })
    else
      Sidekiq::Client.push_bulk("class" => "NoopJob", "queue" => "default", "args" => slice.map { |i| [i] })
    end
  end
  size = Sidekiq::Queue.new("default").size
  abort "pushed #{size}, not #{n}" unless size == n
end

# Polls the queue until the consumer has taken all n jobs; returns jobs/s
# from the first job taken to the last. (Not `stat:processed`: Sidekiq 6
# adds its counts to it only every few seconds.) The last jobs taken are
# still running then: at most the consumer's concurrency, a rounding
# error at N = 100,000.
def measure(n, pid)
  first = nil
  loop do
    left = redis { |c| c.llen("queue:default") }
    now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    first ||= now if left < n
    return n / (now - first) if left.zero? && now > first
    if Process.waitpid(pid, Process::WNOHANG)
      abort "the consumer exited with #{left} of #{n} jobs left" unless left.zero?
    end
    sleep 0.002
  end
end

def wasmjobs_case(wasmjobs, plugins, url, n, activejob, same_size: false)
  push(n, activejob: activejob, same_size: same_size)
  pid = spawn(wasmjobs, "run", "--plugins", plugins, "--redis", url, "-q", "default", "--exit-when-empty",
              "--log-format", "json", out: File::NULL, err: File::NULL)
  rate = measure(n, pid)
  Process.wait(pid)
  rate
end

def sidekiq_case(worker, url, n, activejob, concurrency)
  push(n, activejob: activejob, klass: activejob ? "NoopActiveJob" : "NoopJob")
  pid = spawn({ "REDIS_URL" => url }, "sidekiq", "-r", worker, "-q", "default", "-c", concurrency.to_s,
              out: File::NULL, err: File::NULL)
  rate = measure(n, pid)
  Process.kill("TERM", pid)
  Process.wait(pid)
  rate
end

cases = {
  "wasm-plain" => -> { wasmjobs_case(wasmjobs, plugins, url, n, false) },
  "wasm-aj" => -> { wasmjobs_case(wasmjobs, plugins, url, n, true) },
  "ruby-native" => -> { sidekiq_case(worker, url, n, false, concurrency) },
  "ruby-aj" => -> { sidekiq_case(worker, url, n, true, concurrency) },
}
# BENCH_SAME_SIZE=1: also plain jobs as large as the wrappers, to tell the
# cost of the bytes from the cost of unwrapping.
if ENV["BENCH_SAME_SIZE"] == "1"
  cases["wasm-plain-large"] = -> { wasmjobs_case(wasmjobs, plugins, url, n, false, same_size: true) }
end
results = Hash.new { |h, k| h[k] = [] }
rounds.times do |round|
  order = round.even? ? cases.keys : cases.keys.reverse
  order.each do |name|
    rate = cases[name].call
    results[name] << rate
    $stderr.puts format("round %d  %-12s %10.0f jobs/s", round + 1, name, rate)
  end
end

mean = ->(xs) { xs.sum / xs.size }
ratio = ->(a, b) { results[a].zip(results[b]).map { |x, y| x / y } }
puts "| case | " + (1..rounds).map { |r| "round #{r}" }.join(" | ") + " | mean |"
puts "|---|" + "--:|" * (rounds + 1)
cases.each_key do |name|
  puts "| #{name} (jobs/s) | " + results[name].map { |r| format("%.0f", r) }.join(" | ") + format(" | %.0f |", mean.(results[name]))
end
pairs = [%w[wasm-aj wasm-plain], %w[ruby-aj ruby-native], %w[wasm-aj ruby-aj], %w[wasm-plain ruby-native]]
pairs += [%w[wasm-plain-large wasm-plain], %w[wasm-aj wasm-plain-large]] if cases.key?("wasm-plain-large")
pairs.each do |a, b|
  rs = ratio.(a, b)
  puts "| #{a} ÷ #{b} | " + rs.map { |r| format("%.2f", r) }.join(" | ") + format(" | %.2f |", mean.(rs))
end
puts
puts "N = #{n} noop jobs a case; wasmjobs --concurrency 100 (default), sidekiq -c #{concurrency}; " \
     "rates from the first job taken from the queue to the last."
