# frozen_string_literal: true

require_relative "test_helper"
require "net/http"
require "tmpdir"

# Strobe::Middleware under a real Puma (issue 19), started as a server on
# 127.0.0.1 with the application gems `rake deps` installs.
class TestPuma < Minitest::Test
  APP = File.join(__dir__, "apps/puma/config.ru")

  # Puma 8.0.2's cluster workers sometimes hang on TERM under Ruby 3.4, with
  # or without Strobe: the TERM trap's write to the server's notify pipe
  # races the server thread's IO#close of it, and the close never returns
  # (puma#3677, fixed on Puma's main by puma#3940 after 8.0.2, not released
  # yet). Measured here on 2026-11-24: 2 hangs in 20 start/stop cycles of a
  # bare Rack app without Strobe, 2 in 20 with the middleware; 0 in 15 on
  # Ruby 4.0. Where that race exists a cycle whose shutdown hangs is run
  # again, at most twice; on other Rubies a hang fails the test.
  PUMA_SHUTDOWN_RACE = RUBY_VERSION.start_with?("3.4.")

  class ShutdownHang < StandardError; end

  # Starts Puma with args, yields its port and pid, and stops it with TERM;
  # returns its output. If it has not exited 30 s later it raises
  # ShutdownHang; then, or when the test fails meanwhile, its whole process
  # group is killed.
  def with_puma(dir, *args, env: {})
    log = File.join(dir, "puma.log")
    env = app_gems_env.merge("STROBE_OUT" => dir, "RUBYLIB" => StrobeTestHelpers::LIB).merge(env)
    pid = Process.spawn(env, RbConfig.ruby, "-I#{ENV['STROBE_LIB'] || StrobeTestHelpers::LIB}", "-rpuma/cli", "-e",
                        "Puma::CLI.new(ARGV).run", "--", "-b", "tcp://127.0.0.1:0", *args, APP,
                        out: log, err: [:child, :out], pgroup: true)
    exited = false
    begin
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
      until (port = File.read(log)[%r{Listening on http://127\.0\.0\.1:(\d+)}, 1])
        flunk "Puma did not start: #{File.read(log)}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        flunk "Puma exited: #{File.read(log)}" if (exited = Process.waitpid(pid, Process::WNOHANG))
        sleep 0.1
      end
      yield Integer(port), pid
      Process.kill(:TERM, pid)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
      sleep 0.1 until (exited = Process.waitpid(pid, Process::WNOHANG)) ||
                      Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      raise ShutdownHang, "Puma did not stop within 30 s: #{File.read(log)}" unless exited
    ensure
      unless exited
        begin
          Process.kill(:KILL, -pid)
          Process.wait(pid)
        rescue Errno::ESRCH, Errno::ECHILD
          nil
        end
      end
    end
    File.read(log)
  end

  # GETs / until each of the workers has answered at least `each` times
  # (at most 20 s); returns the count per worker pid.
  def requests_per_worker(port, workers:, each:)
    served = Hash.new(0)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
    until served.size == workers && served.values.min >= each
      flunk "not every worker answered: #{served}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      response = Net::HTTP.start("127.0.0.1", port, open_timeout: 5, read_timeout: 10) { |http| http.get("/") }
      assert_equal "200", response.code
      served[Integer(response.body)] += 1
    end
    served
  end

  # Runs a 2-worker cluster with args until each worker has served 3
  # requests, stops it, and yields its output directory, the requests served
  # per worker pid and the master's pid. A shutdown that hangs where Puma's
  # own race exists is run again (PUMA_SHUTDOWN_RACE); anywhere else, or a
  # third time, it fails.
  def with_served_cluster(*args, env: {})
    attempts = 0
    begin
      Dir.mktmpdir do |dir|
        served = master = nil
        with_puma(dir, "-w", "2", "-t", "2:2", *args, env: env) do |port, pid|
          master = pid
          served = requests_per_worker(port, workers: 2, each: 3)
        end
        yield dir, served, master
      end
    rescue ShutdownHang => e
      flunk e.message unless PUMA_SHUTDOWN_RACE && (attempts += 1) < 3
      retry
    end
  end

  # Cluster mode, with and without preload_app!: each worker writes its own
  # profile, named by its pid, holding its own requests; the master none.
  # What the master profiled before forking is in no worker's file.
  def test_each_cluster_worker_saves_its_own_profile
    [[], ["--preload"]].each do |preload|
      # (Without preload_app! the workers load the application: only a
      # preloading master profiles before they fork.)
      env = preload.empty? ? {} : { "MASTER_PROFILE" => "1" }
      with_served_cluster(*preload, env: env) do |dir, served, master|
        files = Dir[File.join(dir, "strobe-*.json")]
        pids = files.map { |f| Integer(File.basename(f)[/strobe-wall-(\d+)-/, 1]) }
        assert_equal served.keys.sort, pids.sort, "one file per worker #{preload.inspect}"
        refute_includes pids, master
        files.each do |file|
          result = Strobe.load(file)
          pid = Integer(File.basename(file)[/strobe-wall-(\d+)-/, 1])
          requests = result[:markers].count { |m| m[:type] == :request }
          assert_equal served[pid], requests, "#{file}: its worker's requests"
          names = result[:frames].values.map { |f| f[:name] }
          assert_includes names, "PumaApp.worker_work"
          refute_includes names, "PumaApp.master_work", "the master's profile before the fork"
        end
      end
    end
  end
end
