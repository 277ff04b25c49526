# frozen_string_literal: true

# How true a profile is: programs whose time is measured independently of
# any profiler (the thread's CPU clock and the monotonic clock read around
# each phase), profiled by Strobe, stackprof and (where installed) vernier
# in the same run, each in a child process of its own.
#
#   ruby -Ilib bench/accuracy.rb [PROGRAM...]
#
# For each program, mode (:cpu, :wall) and rate it prints, per profiler,
# the largest error in percentage points between a phase's true share of
# the time and its share of the samples (weighted), which phase it was,
# and the share of intervals counted missed (Strobe and stackprof say).
# A sample belongs to the phase whose method (Object#phase_NAME) is on
# its stack; the rest of the program's time and samples is "(other)".
#
# Settings: ACCURACY_SECONDS [10] per run, ACCURACY_RATES [100,1000,10000]
# (Hz), ACCURACY_MODES [cpu,wall], ACCURACY_PROFILERS
# [strobe,stackprof,vernier] (each skipped when it cannot load).
# test/test_accuracy.rb runs short versions of some of them.
require "io/wait"
require "json"
require "rbconfig"

module Accuracy
  # Each program: the phases of one loop, run on the main thread until the
  # time is up. `threads: true` programs run their phases on threads of
  # their own (the truth is each thread's CPU clock), :cpu only.
  PROGRAMS = {
    # CPU-bound Ruby, two methods 60/40.
    "ruby" => { phases: { "fib" => "fib(17)", "loop" => "spin_for(0.0008)" } },
    # A C function that holds the GVL.
    "zlib" => { phases: { "deflate" => "Zlib.deflate(DATA_1K * 64)", "ruby" => "fib(15)" } },
    # Short system calls in a loop.
    "syscalls" => { phases: { "file" => "40.times { File.file?(THIS_FILE) }",
                              "stat" => "40.times { File.stat(THIS_FILE) }", "ruby" => "fib(14)" } },
    # Sleeping (no CPU) between bursts of CPU.
    "sleep" => { phases: { "spin" => "spin_for(0.012)", "sleep" => "sleep(0.01)" } },
    # Waiting on a pipe nobody writes to, and on a socket.
    "pipe" => { phases: { "pipe" => "IO.select([PIPE_R], nil, nil, 0.004)",
                          "socket" => "IO.select([SOCKET], nil, nil, 0.003)", "spin" => "spin_for(0.006)" } },
    # Thread#join and Queue#pop, waiting on another thread.
    "join" => { phases: { "join" => "Thread.new { sleep 0.003 }.join",
                          "pop" => "q = Queue.new; Thread.new { sleep 0.003; q << 1 }; q.pop",
                          "spin" => "spin_for(0.005)" } },
    # Allocation-heavy code (GC), beside plain CPU.
    "gc" => { phases: { "alloc" => "2_000.times { Array.new(20) { |i| \"s\#{i}\" } }", "spin" => "spin_for(0.004)" } },
    # A service's loop: short phases of a few ms each.
    "mixed" => { phases: { "spin" => "spin_for(0.003)", "file" => "60.times { File.file?(THIS_FILE) }",
                           "sleep" => "sleep(0.002)", "deflate" => "Zlib.deflate(DATA_1K * 32)",
                           "select" => "IO.select([PIPE_R], nil, nil, 0.001)" } },
    # Four threads contending for the GVL, their work split 40/30/20/10.
    "threads" => { threads: true, modes: %w[cpu],
                   phases: { "t40" => "spin_for(0.004)", "t30" => "spin_for(0.003)", "t20" => "spin_for(0.002)",
                             "t10" => "spin_for(0.001)" } },
  }.freeze

  PROFILERS = %w[strobe stackprof vernier].freeze

  module_function

  # The child's program: helpers, a method per phase, and the loop that
  # times each phase.
  def program_source(name)
    spec = PROGRAMS.fetch(name)
    methods = spec[:phases].map { |phase, code| "def phase_#{phase}\n  #{code}\nend\n" }.join
    <<~RUBY
      require "zlib"
      require "socket"
      DATA_1K = Random.new(1).bytes(1024).freeze
      THIS_FILE = #{__FILE__.inspect}
      PIPE_R, PIPE_W = IO.pipe
      SOCKET, SOCKET_PEER = UNIXSocket.pair
      CPU = Process::CLOCK_THREAD_CPUTIME_ID
      WALL = Process::CLOCK_MONOTONIC
      def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
      def spin_for(seconds)
        t = Process.clock_gettime(CPU)
        nil while Process.clock_gettime(CPU) - t < seconds
      end
      #{methods}
    RUBY
  end

  # Child: runs program for seconds under profiler in mode at rate (Hz);
  # returns {truth: {phase => seconds}, samples: {phase => weight}, missed:}.
  def child(name, mode, rate, profiler, seconds)
    spec = PROGRAMS.fetch(name)
    Object.class_eval(program_source(name)) # rubocop:disable Security/Eval
    phases = spec[:phases].keys
    clock = mode == "cpu" ? Process::CLOCK_THREAD_CPUTIME_ID : Process::CLOCK_MONOTONIC
    interval = 1_000_000 / Integer(rate)
    truth = Hash.new(0.0)
    session = Session.new(profiler, mode, interval, main_only: !spec[:threads])
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    session.profile do
      if spec[:threads]
        run_threads(phases, deadline, truth)
      else
        start = Process.clock_gettime(clock)
        until Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          phases.each do |phase|
            t = Process.clock_gettime(clock)
            send("phase_#{phase}")
            truth[phase] += Process.clock_gettime(clock) - t
          end
        end
        truth["(other)"] = Process.clock_gettime(clock) - start - truth.values.sum
      end
    end
    { truth: truth, samples: session.samples(phases), missed: session.missed, total: session.total }
  end

  # Each phase on a thread of its own, looping until the deadline; its
  # truth is its thread's CPU clock.
  def run_threads(phases, deadline, truth)
    lock = Mutex.new
    phases.map do |phase|
      Thread.new do
        start = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
        send("phase_#{phase}") until Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        used = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - start
        lock.synchronize { truth[phase] += used }
      end
    end.each(&:join)
  end

  # One profiler, as the child drives it.
  class Session
    # main_only: only the main thread's samples count (helper threads of
    # join and pop sleep inside a phase's block).
    def initialize(profiler, mode, interval, main_only:)
      @profiler = profiler
      @mode = mode.to_sym
      @interval = interval
      @main_only = main_only
      require profiler == "strobe" ? "strobe" : profiler
    end

    def profile
      case @profiler
      when "strobe"
        threads = @main_only ? [Thread.current] : :all
        @result = Strobe.run(mode: @mode, interval: @interval, raw: true, threads: threads) { yield }
      when "stackprof" then @result = StackProf.run(mode: @mode, interval: @interval, raw: true) { yield }
      when "vernier"
        # (vernier's :wall mode samples every thread; :retained and no
        # :cpu mode: its time is wall time.)
        @result = Vernier.profile(mode: :wall, interval: @interval) { yield }
      end
    end

    # {phase => weight} over all the profile's samples.
    def samples(phases)
      counts = Hash.new(0)
      pattern = /\bphase_(#{phases.map { |p| Regexp.escape(p) }.join('|')})\b/
      each_stack do |names, weight|
        phase = names.each { |n| break Regexp.last_match(1) if n =~ pattern }
        counts[phase.is_a?(String) ? phase : "(other)"] += weight
      end
      counts
    end

    def missed
      @profiler == "vernier" ? nil : @result[:missed_samples]
    end

    def total
      total = 0
      each_stack { |_, weight| total += weight }
      total
    end

    private

    # Yields each recorded stack's frame names and its weight.
    def each_stack(&block)
      if @profiler == "vernier"
        each_vernier_stack(&block)
      else
        raw_stacks(@profiler == "strobe" ? Strobe.expand(@result) : @result, &block)
      end
    end

    def raw_stacks(result)
      frames = result[:frames]
      raw = result[:raw] || []
      i = 0
      while i < raw.size
        len = raw[i]
        names = raw[i + 1, len].map { |id| frames.dig(id, :name).to_s }
        yield names, raw[i + len + 1]
        i += len + 2
      end
    end

    def each_vernier_stack
      @result.threads.each_value do |thread|
        next if @main_only && !thread[:is_main]

        thread[:samples].each_with_index do |stack, i|
          names = []
          while stack
            names << @result.stack_table.stack_frame_idx(stack).then { |f| @result.stack_table.frame_name(f) }
            stack = @result.stack_table.stack_parent_idx(stack)
          end
          yield names, thread[:weights][i]
        end
      end
    end
  end

  LIB = File.expand_path("../lib", __dir__)

  # Parent: runs one case in a child (killed if it takes three times its
  # seconds and 30 more); its report with shares and errors, or nil.
  # STROBE_LIB (a build of the extension elsewhere, as the sanitizer
  # suite's) comes first on the child's load path.
  def measure(name, mode, rate, profiler, seconds)
    code = "require #{File.expand_path(__FILE__).inspect}\n" \
           "puts JSON.generate(Accuracy.child(*ARGV[0, 4], Float(ARGV[4])))"
    cmd = [RbConfig.ruby, *[ENV["STROBE_LIB"], LIB].compact.map { |dir| "-I#{dir}" }, "-e", code, "--",
           name, mode, rate.to_s, profiler, seconds.to_s]
    out = +""
    IO.popen(cmd, err: File::NULL) do |io|
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds * 3 + 30
      until io.eof?
        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        if left <= 0 || !io.wait_readable(left)
          Process.kill(:KILL, io.pid)
          break
        end
        out << io.readpartial(65_536)
      end
    end
    return nil unless $?.success? && !out.empty?

    score(JSON.parse(out.lines.last, symbolize_names: false))
  rescue EOFError
    nil
  end

  # The shares (percent) of truth and samples per phase, the largest
  # difference (points) and its phase, and the share of intervals missed.
  def score(report)
    truth = report["truth"]
    samples = report["samples"]
    truth_total = truth.values.sum
    sample_total = samples.values.sum
    phases = (truth.keys | samples.keys)
    shares = phases.to_h do |phase|
      [phase, [100.0 * truth.fetch(phase, 0) / truth_total, sample_total.zero? ? 0.0 : 100.0 * samples.fetch(phase, 0) / sample_total]]
    end
    worst = shares.max_by { |_, (t, s)| (t - s).abs }
    missed = report["missed"] && (100.0 * report["missed"] / [report["missed"] + sample_total, 1].max)
    { shares: shares, error: (worst[1][0] - worst[1][1]).abs, worst: worst[0], missed: missed, samples: sample_total }
  end

  def available(profilers)
    profilers.select do |profiler|
      system(RbConfig.ruby, "-I#{LIB}", "-e", "require #{profiler.inspect}",
             out: File::NULL, err: File::NULL)
    end
  end

  def main(argv)
    seconds = Float(ENV.fetch("ACCURACY_SECONDS", "10"))
    rates = ENV.fetch("ACCURACY_RATES", "100,1000,10000").split(",").map { |r| Integer(r) }
    modes = ENV.fetch("ACCURACY_MODES", "cpu,wall").split(",")
    profilers = available(ENV.fetch("ACCURACY_PROFILERS", PROFILERS.join(",")).split(","))
    programs = argv.empty? ? PROGRAMS.keys : argv
    puts "Ruby #{RUBY_VERSION}, #{seconds} s a run; error: largest |true share - sample share| of a phase, in points"
    puts "(worst phase); missed: intervals counted missed, % of all"
    programs.each do |name|
      modes.each do |mode|
        next unless PROGRAMS.fetch(name).fetch(:modes, %w[cpu wall]).include?(mode)

        rates.each do |rate|
          cells = profilers.map do |profiler|
            next "-" if profiler == "vernier" && mode == "cpu" # (vernier has no CPU-time mode)

            r = measure(name, mode, rate, profiler, seconds)
            next "failed" unless r

            format("%5.1f (%s)%s", r[:error], r[:worst], r[:missed] ? format(" m%.1f%%", r[:missed]) : "")
          end
          puts format("%-9s %-4s %5d Hz  %s", name, mode, rate, profilers.zip(cells).map { |p, c| "#{p}: #{c}" }.join("   "))
          $stdout.flush
        end
      end
    end
  end
end

Accuracy.main(ARGV) if $PROGRAM_NAME == __FILE__
