# frozen_string_literal: true

require_relative "test_helper"
require_relative "puma_server"
require_relative "protobuf_reader"
require_relative "pyroscope_receiver"
require "tmpdir"

# Strobe::Middleware under a real Puma (issue 19), started as a server on
# 127.0.0.1 with the application gems `rake deps` installs.
class TestPuma < Minitest::Test
  include PumaServer

  APP = File.join(__dir__, "apps/puma/config.ru")

  # Runs a 2-worker cluster with args until each worker has served 3
  # requests, stops it, and yields its output directory, the requests served
  # per worker pid and the master's pid.
  def with_served_cluster(*args, env: {})
    retrying_shutdown_hang do |dir|
      served = master = nil
      with_puma(dir, APP, "-w", "2", "-t", "2:2", *args, env: env) do |port, pid|
        master = pid
        served = requests_per_worker(port, workers: 2, each: 3)
      end
      yield dir, served, master
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

  # Continuous profiling in a preloading cluster: each worker uploads its
  # own windows, labelled with its own pid, whose request samples carry
  # their endpoint. (A worker's session starts a second after its fork:
  # requests go on until every worker has uploaded such a window.)
  def test_each_cluster_worker_pushes_its_own_continuous_profile
    if ENV["LD_PRELOAD"].to_s.include?("libasan")
      # GCC 12's libasan has no fork handlers for its allocator: a worker
      # forked while a thread of the master is starting (Ruby starts one
      # after each fork; Puma forks its workers back to back) hangs in its
      # first allocation of that size (one worker of two never answered).
      # test_continuous forks with the same session, spaced, under ASan.
      skip "ASan's allocator is not fork-safe with threads starting in the parent"
    end
    receiver = PyroscopeReceiver.new
    retrying_shutdown_hang do |dir|
      with_puma(dir, APP, "-w", "2", "-t", "2:2", "--preload", env: { "CONTINUOUS_URL" => receiver.url }) do |port, master|
        workers = requests_per_worker(port, workers: 2, each: 1).keys
        labelled = lambda do
          receiver.all_uploads.select { |u| workers.include?(Integer(u.labels["pid"])) }.select do |u|
            ProtobufReader.profile(u.profile)[:samples].any? { |x| x[:labels].to_h["endpoint"] == "GET /" }
          end.map { |u| Integer(u.labels["pid"]) }.uniq
        end
        wait_until(60, -> { "workers #{workers}, master #{master}, uploads from #{labelled.call}" }) do
          get(port, "/")
          labelled.call.sort == workers.sort
        end
        assert(receiver.all_uploads.all? { |u| u.app == "puma-app.cpu" })
      end
    end
  ensure
    receiver&.stop
  end

  # Single mode, a permitted request asking for its own profile (?strobe=1)
  # of a Rack app whose code reports through ActiveSupport notifications
  # what a Rails app would (test_rails.rb runs a real one on Ruby 4.0).
  def test_a_request_gets_its_own_profile
    retrying_shutdown_hang do |dir|
      with_puma(dir, APP, "-t", "4:4", env: { "PER_REQUEST" => "1" }) do |port|
        get(port, "/posts")
        assert_own_profiles(port, dir, "/posts", frame: "PumaApp.posts", endpoint: "GET /posts",
                                                 sql: "SELECT * FROM posts WHERE id = ?")
      end
    end
  end
end
