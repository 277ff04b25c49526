# frozen_string_literal: true

# Shared code for the scripts in bench/: settings from the environment,
# timing and medians, a stack of a given depth, a CPU-bound workload with
# varied stacks, and a plain-text table.
#
# Run the scripts from the repository root as `ruby -Ilib bench/X.rb`; the
# lib/ path is added here too, so `ruby bench/X.rb` works as well.

$stdout.sync = true
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "strobe"
require "stackprof"

module Bench
  module_function

  # An Integer setting from the environment.
  def env_int(name, default)
    Integer(ENV.fetch(name, default).to_s.delete("_"))
  end

  # A Float setting from the environment.
  def env_float(name, default)
    Float(ENV.fetch(name, default))
  end

  # A boolean setting from the environment ("0", "false", "no" are false).
  def env_bool(name, default)
    value = ENV[name]
    return default if value.nil? || value.empty?

    !%w[0 false no off].include?(value.downcase)
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # Seconds the block takes.
  def time
    start = now
    yield
    now - start
  end

  def median(values)
    sorted = values.sort
    mid = sorted.size / 2
    sorted.size.odd? ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2.0
  end

  # Calls the block with `frames` more frames on the stack than the caller
  # has (each level is one Ruby method frame).
  def descend(frames, &block)
    frames.positive? ? descend(frames - 1, &block) : yield
  end

  # "0.123" style ratio, or "n/a" when the denominator is not positive.
  def ratio(ours, theirs, digits = 3)
    return "n/a" unless theirs.is_a?(Numeric) && theirs.positive?

    format("%.#{digits}f", ours.to_f / theirs)
  end

  # Prints rows under headers, columns right-aligned (the first left-aligned).
  def table(headers, rows, io: $stdout)
    cells = [headers, *rows].map { |row| row.map(&:to_s) }
    widths = headers.each_index.map { |i| cells.map { |row| row[i].to_s.size }.max }
    cells.each_with_index do |row, index|
      line = row.each_with_index.map do |cell, i|
        i.zero? ? cell.ljust(widths[i]) : cell.rjust(widths[i])
      end
      io.puts line.join("  ").rstrip
      io.puts widths.map { |w| "-" * w }.join("  ") if index.zero?
    end
  end

  # {job => the block's value for it}, computed by `workers` threads (the
  # block runs a child process: valgrind, say), a dot on stderr per job.
  def in_parallel(jobs, workers)
    results = {}
    queue = Queue.new
    jobs.each { |job| queue << job }
    queue.close
    Array.new(workers) do
      Thread.new do
        while (job = queue.pop)
          results[job] = yield(job)
          $stderr.print "."
        end
      end
    end.each(&:join)
    $stderr.puts
    results
  end

  # Runs `ruby script --child *args` under valgrind's callgrind in dir (name
  # tells its files apart): [its callgrind output file, what it printed].
  def callgrind(script, dir, name, *args)
    require "rbconfig"
    out = File.join(dir, "callgrind.#{name}.out")
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=#{out}", "--log-file=#{out}.log", RbConfig.ruby,
           "-I#{File.expand_path('../lib', __dir__)}", script, "--child", *args.map(&:to_s)]
    printed = IO.popen(cmd, &:read)
    raise "valgrind failed (#{cmd.join(' ')}); see #{out}.log" unless $?.success?

    [out, printed]
  end

  # The whole process's instructions in a callgrind output file.
  def callgrind_total(out)
    line = File.foreach(out).find { |l| l.start_with?("summary:", "totals:") } or raise "no totals in #{out}"
    Integer(line.split[1])
  end

  def header(title, io: $stdout)
    io.puts
    io.puts title
    io.puts "=" * title.size
  end

  # A CPU-bound program with varied stacks about `depth` frames deep: a
  # recursion that picks one of three methods at each level (so consecutive
  # units take different paths), ending in one of several leaves doing
  # hash, string, array or arithmetic work with a few calls of their own.
  # `run(units)` does a fixed amount of work.
  class Workload
    WORDS = %w[alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu].freeze

    attr_reader :depth

    def initialize(depth: 30)
      @depth = depth
      @levels = [depth - 14, 1].max # the caller and the leaves add the rest
      @sink = 0
    end

    def run(units)
      u = 0
      while u < units
        @sink ^= level_a(@levels, u).hash
        u += 1
      end
      @sink
    end

    # Units per segment so that run(units) takes about `seconds`.
    def calibrate(seconds)
      units = 16
      loop do
        elapsed = Bench.time { run(units) }
        return [(units * seconds / elapsed).round, 1].max if elapsed > 0.05

        units *= 4
      end
    end

    private

    # Each level does a little arithmetic, then descends through one of the
    # three level methods (one frame per level).
    def level_a(n, u)
      return leaf(u) if n.zero?

      case (n * 3 + u) % 3
      when 0 then level_b(n - 1, u)
      when 1 then level_c(n - 1, u)
      else level_a(n - 1, u)
      end
    end

    def level_b(n, u)
      return leaf(u + 1) if n.zero?

      case ((n ^ u) & 7) % 3
      when 0 then level_b(n - 1, u)
      when 1 then level_c(n - 1, u)
      else level_a(n - 1, u)
      end
    end

    def level_c(n, u)
      return leaf(u + 2) if n.zero?

      case (n + (u >> 1)) % 3
      when 0 then level_b(n - 1, u)
      when 1 then level_c(n - 1, u)
      else level_a(n - 1, u)
      end
    end

    def leaf(u)
      case u % 4
      when 0 then hash_work(u)
      when 1 then string_work(u)
      when 2 then array_work(u)
      else math_work(u)
      end
    end

    def hash_work(u)
      counts = Hash.new(0)
      WORDS.each_with_index { |word, i| counts[word] += i + u }
      counts.select { |_, v| v.odd? }.sum { |_, v| v }
    end

    def string_work(u)
      text = WORDS.rotate(u % WORDS.size).join(" ")
      text = text.upcase.tr("AEIOU", "aeiou")
      text.split(" ").map(&:size).sum + text.count("a")
    end

    def array_work(u)
      values = Array.new(24) { |i| (i * 7919 + u) % 101 }
      values.sort.each_slice(4).map(&:sum).max
    end

    def math_work(u)
      fib(12 + (u & 1)) + (1..40).reduce(u) { |acc, i| (acc * 31 + i) % 65_521 }
    end

    def fib(n)
      n < 2 ? n : fib(n - 1) + fib(n - 2)
    end
  end
end
