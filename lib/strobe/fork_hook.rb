# frozen_string_literal: true

module Strobe
  # What Strobe's Ruby side does in a forked child as it starts, through
  # Process._fork (Ruby 3.1+), the method Ruby provides for monitoring
  # libraries to wrap: every fork made from Ruby (Kernel#fork,
  # Process.fork, IO.popen("-")) goes through it. Process.daemon does not
  # (Ruby 3.1 to 4.0 call daemon(3)): it is wrapped too, and the daemon
  # runs the actions once. A fork(2) made by C code goes through neither.
  # (The C side has its own pthread_atfork handlers: fork.c.)
  #
  #   ForkHook.in_child { ... }   # runs in each child, in the order given
  module ForkHook
    @actions = []
    @ran_in = Process.pid # (the process the actions last ran in)

    class << self
      # Registers a block to run in every child forked from now on, and
      # wraps Process._fork, once.
      def in_child(&block)
        @actions << block
        return if Process.singleton_class.include?(Wrapper)

        Process.singleton_class.prepend(Wrapper)
      end

      # In the child: each action, whatever the others raise (a child must
      # not die of a profiler's trouble). Once per process.
      def run_in_child
        return if @ran_in == Process.pid

        @ran_in = Process.pid
        @actions.each do |action|
          action.call
        rescue StandardError => e
          $stderr.write("strobe: in the forked child: #{e.class}: #{e.message}\n")
        end
      end
    end

    # Prepended to Process's singleton class.
    module Wrapper
      def _fork
        pid = super
        ForkHook.run_in_child if pid.zero?
        pid
      end

      # Returns in the daemon only (its parent exits inside).
      def daemon(...)
        result = super
        ForkHook.run_in_child
        result
      end
    end
  end
end
