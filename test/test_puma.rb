# frozen_string_literal: true

require_relative "test_helper"
require "net/http"
require "tmpdir"

# Strobe::Middleware under a real Puma (issue 19), started as a server on
# 127.0.0.1 with the application gems `rake deps` installs.
class TestPuma < Minitest::Test
  APP = File.join(__dir__, "apps/puma/config.ru")

  # Starts Puma with args, yields its port and pid, and stops it (TERM;
  # its whole process group is killed if it is still there after 30 s, or
  # when the test fails meanwhile); returns its output.
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
      flunk "Puma did not stop within 30 s: #{File.read(log)}" unless exited
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

  # Cluster mode, with and without preload_app!: each worker writes its own
  # profile, named by its pid, holding its own requests; the master none.
  # What the master profiled before forking is in no worker's file.
  def test_each_cluster_worker_saves_its_own_profile
    # Known, open (issue 19): under Ruby 3.4.10 a cluster worker sometimes
    # does not exit on TERM within Puma's 30 s with the middleware loaded
    # (CI and 3 of 5 local runs on 2026-11-23, with or without --preload;
    # not seen on 3.1, 3.3 or 4.0, nor in 13 runs by hand). Until its cause
    # is found this test runs on the other Rubies only.
    skip "a Puma worker's shutdown hang on Ruby 3.4, under investigation (issue 19)" if RUBY_VERSION.start_with?("3.4.")
    [[], ["--preload"]].each do |preload|
      Dir.mktmpdir do |dir|
        served = nil
        master = nil
        # (Without preload_app! the workers load the application: only a
        # preloading master profiles before they fork.)
        env = preload.empty? ? {} : { "MASTER_PROFILE" => "1" }
        with_puma(dir, "-w", "2", "-t", "2:2", *preload, env: env) do |port, pid|
          master = pid
          served = requests_per_worker(port, workers: 2, each: 3)
        end
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
