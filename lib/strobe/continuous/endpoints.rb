# frozen_string_literal: true

require_relative "../middleware"

module Strobe
  class Continuous
    # Rack middleware that gives continuous profiles their endpoints: each
    # request, while Strobe samples, is marked on its thread's timeline as
    # Strobe::Middleware marks it (Rails' Controller#action, else method
    # and path's shape), and the pprof of each window labels its samples
    # `endpoint` (a filter in Pyroscope's UI). It profiles nothing itself;
    # without a profile running it only calls the application.
    #
    #   Rails.application.config.middleware.insert(0, Strobe::Continuous::Endpoints)
    #
    # A request that spans two windows is marked in the second: the first
    # window's samples of it carry no endpoint.
    class Endpoints
      def initialize(app)
        @app = app
        @warned = false
      end

      def call(env)
        since = Native.now_us if Strobe.running?
        response = @app.call(env)
      ensure
        mark(env, since, response) if since
      end

      private

      def mark(env, since, response)
        Middleware.mark_request(env, since, response)
      rescue StandardError => e
        return if @warned

        @warned = true
        Continuous.warn_line($stderr, "could not mark a request: #{e.message}")
      end
    end
  end
end
