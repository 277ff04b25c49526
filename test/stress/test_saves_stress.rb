# frozen_string_literal: true

# `rake test:stress`: saves of different results to the same paths at once,
# from threads and from forked processes, while the saving process is
# profiled at 10 kHz. Every save must succeed; each file, read at any
# moment, must be one of the saved results, whole; no temporary file may be
# left. Runs in a child process (a crash fails the test instead of ending
# the run); every loop is bounded by a count and by a deadline.
require "test_helper"
require "tmpdir"

class TestSavesStress < Minitest::Test
  ROUNDS = Integer(ENV.fetch("STRESS_ROUNDS", "2"))
  TIMEOUT = 180
  RUBY_ARGS = ENV.fetch("STRESS_RUBY_ARGS", "").split

  # ARGV: the directory to save in, and the path of the profile of the run.
  CODE = <<~'RUBY'
    require "strobe"
    $stdout.sync = true
    dir, out = ARGV
    paths = %w[p.json p.json.gz].map { |name| File.join(dir, name) }
    now = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
    deadline = now.() + 30
    def churn = Array.new(200) { |i| "s#{i}" }.map(&:upcase).join.size

    # Results that differ (in their samples and metadata), made before
    # profiling starts; writer k saves results[k].
    results = Array.new(8) do |k|
      Strobe.run(mode: :custom, raw: true, metadata: { writer: k }) { (500 + 100 * k).times { Strobe.sample } }
    end
    paths.each { |path| Strobe.save(results[0], path) }
    save_rounds = lambda do |k|
      60.times do |round|
        break if now.() > deadline

        Strobe.save(results[k], paths[round % 2])
        churn
      end
    end

    Strobe.start(mode: :wall, interval: 100, raw: true)
    children = (4...8).map do |k|
      fork do
        save_rounds.(k)
        exit!(0)
      rescue Exception => e # rubocop:disable Lint/RescueException -- reported, then the child ends
        warn "child #{k}: #{e.class}: #{e.message}"
        exit!(1)
      end
    end
    errors = Queue.new
    writers = (0...4).map do |k|
      Thread.new do
        save_rounds.(k)
      rescue StandardError => e
        errors << "thread #{k}: #{e.class}: #{e.message}"
      end
    end
    reads = 0
    loop do
      break unless (writers.any?(&:alive?) || reads.zero?) && reads < 4000 && now.() < deadline

      path = paths[reads % 2]
      reads += 1
      loaded = Strobe.load(path)
      writer = loaded.dig(:metadata, :writer)
      errors << "#{path} is not a saved result whole (writer #{writer.inspect})" unless results[writer] == loaded
    rescue StandardError => e
      errors << "reading #{path}: #{e.class}: #{e.message}"
    end
    writers.each(&:join)
    children.each do |pid|
      _, status = Process.wait2(pid)
      errors << "child #{pid}: #{status.inspect}" unless status.success?
    end
    Strobe.stop
    Strobe.save(Strobe.results, out)
    paths.each do |path|
      writer = Strobe.load(path).dig(:metadata, :writer)
      errors << "#{path}: not a saved result at the end" unless results[writer] == Strobe.load(path)
    end
    left = Dir.children(dir).sort - %w[p.json p.json.gz]
    errors << "left in the directory: #{left.inspect}" unless left.empty?
    errors = Array.new(errors.size) { errors.pop }
    puts "reads: #{reads}"
    errors.first(20).each { |e| warn e }
    exit(errors.empty? ? 0 : 1)
  RUBY

  def run_saves
    Dir.mktmpdir("strobe-saves") do |tmp|
      dir = File.join(tmp, "shared")
      Dir.mkdir(dir)
      out = File.join(tmp, "run.json")
      stdout, stderr, status = run_command({}, RbConfig.ruby, *RUBY_ARGS, "-I#{ENV['STROBE_LIB'] || LIB}", "-I#{LIB}",
                                           "-e", CODE, dir, out, timeout: TIMEOUT)
      context = "#{status.inspect}\nstdout: #{stdout[0, 300]}\nstderr: #{stderr[0, 3000]}"
      refute status.signaled?, "killed by a signal: #{context}"
      refute_match(/\[BUG\]|Segmentation fault|AddressSanitizer|runtime error:/, stderr, context)
      assert_equal 0, status.exitstatus, context
      assert_match(/\Areads: [1-9]\d*\n\z/, stdout, context)
      profile = Strobe.load(out)
      assert_operator profile[:samples], :>, 0, context
    end
  end

  ROUNDS.times do |round|
    define_method("test_concurrent_saves_round_#{round + 1}") { run_saves }
  end
end
